#!/usr/bin/env bash
# `dtrain plan`: the chart of a pipeline schedule, and its refusals.
#  - 1f1b at p 4, M 8: four rank rows; the bubble (p-1)/(M+p-1) = 3/11
#    written here, not taken from the program; rank r holds p - r
#    micro-batches at most.
#  - gpipe at p 2, M 3: rank 0 runs its three forwards first.
#  - zb1p at p 64 and M 2^20 answers within 20 s and 1 GB of address
#    space: a bounded chart, and the whole step's figures against ZB-H1's
#    closed form with F = I = W, x = (p-1)/(3M), bubble x/(1+x), makespan
#    3M + p - 1, p micro-batches held until their W on every rank.
#  - zb1p's activations held are the slots `dtrain train` allocates: the
#    "in flight" column of its --dry-run at p 2, M 4 and p 4, M 8 (min(M, p)
#    on every rank: W keeps them, not only I).
#  - --blocks reaches plan, simulate and train's --dry-run alike: GPT-2
#    with attention-only layers has V C + T C + L (4 C^2 + 6 C) + 2 C
#    parameters, worked out here; an unknown kind is refused by each.
#  - bad input exits 2 naming what would work: interleaved with M not a
#    multiple of p, --pp 1, an unknown schedule, a missing --grad-accum,
#    --pp-partition (the chart is in unit time; `dtrain train` chooses),
#    more chunks a rank than a run takes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

check "1f1b, p 4, M 8"
"$DTRAIN" plan --pp 4 --grad-accum 8 --pp-schedule 1f1b >"$TMP/1f1b" 2>&1
expect_eq "$(grep -c '^rank ' "$TMP/1f1b")" 4 "rank rows"
expect_contains "$TMP/1f1b" "formula $(awk 'BEGIN { printf "%.4f", 3 / 11 }')" "the bubble"
expect_contains "$TMP/1f1b" "rank 0: 4, rank 1: 3, rank 2: 2, rank 3: 1" "activations in flight"

check "gpipe, p 2, M 3"
"$DTRAIN" plan --pp 2 --grad-accum 3 --pp-schedule gpipe >"$TMP/gpipe" 2>&1
expect_eq "$(grep '^rank  0' "$TMP/gpipe" | awk '{print $4, $5, $6}')" "F0 F1 F2" "forwards first"

check "zb1p, p 64, M 2^20: bounded"
rc=0
(ulimit -v 1000000 && timeout 20 "$DTRAIN" plan --pp 64 --grad-accum 1048576 \
    --pp-schedule zb1p) >"$TMP/long" 2>&1 || rc=$?
expect_eq "$rc" 0 "exit status of the long chart ($(tail -c 300 "$TMP/long"))"
bubble=$(awk 'BEGIN { x = 63 / (3 * 1048576); printf "%.4g", x / (1 + x) }')
expect_contains "$TMP/long" "formula $bubble, simulated $bubble over makespan 3145791" "bubble"
expect_contains "$TMP/long" "rank 0: 64, rank 1: 64," "activations held, first ranks"
expect_contains "$TMP/long" "rank 62: 64, rank 63: 64" "activations held, last ranks"
expect_contains "$TMP/long" "drawn: 128 of the step's 1048576 micro-batches" "what was elided"
expect_eq "$(grep -c '^rank ' "$TMP/long")" 64 "rank rows"
(($(wc -c <"$TMP/long") < 200000)) || fail "the long chart is $(wc -c <"$TMP/long") bytes"

in_flight() { # p M: the "in flight" column of `dtrain train --dry-run`, stage by stage
    "$DTRAIN" launch -n "$1" -- "$DTRAIN" train --model tiny --pp "$1" --grad-accum "$2" \
        --pp-schedule zb1p --dry-run >"$TMP/dry" 2>&1 || fail "dry run: $(tail -3 "$TMP/dry")"
    awk '/in flight/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $4 }' "$TMP/dry"
}
for pm in "2 4" "4 8"; do
    read -r p M <<<"$pm"
    check "zb1p, p $p, M $M: the activations dtrain train holds"
    "$DTRAIN" plan --pp "$p" --grad-accum "$M" --pp-schedule zb1p >"$TMP/zb" 2>&1
    want="" held=""
    while read -r stage n; do
        want+="${want:+, }rank $stage: $n"
        held+=" $n"
    done < <(in_flight "$p" "$M")
    expect_eq "$held" "$(printf ' %d' $(yes "$p" | head -"$p"))" "the dry run's slots"
    expect_contains "$TMP/zb" "$want" "plan's activations held"
done

check "--blocks in plan, simulate and train --dry-run"
attn_only=(--model gpt2 --blocks ln_1:layernorm,attn:attention)
psi=$(( 50257 * 768 + 1024 * 768 + 12 * (4 * 768 * 768 + 6 * 768) + 2 * 768 ))
"$DTRAIN" simulate --ddp "${attn_only[@]}" --ranks 2 >"$TMP/sim_blocks" 2>&1
expect_contains "$TMP/sim_blocks" "$psi parameters" "simulate's parameter count"
"$DTRAIN" train --dry-run "${attn_only[@]}" --vocab-size 50257 >"$TMP/dry_blocks" 2>&1
expect_contains "$TMP/dry_blocks" "Psi = $psi parameters" "the dry run's parameter count"
"$DTRAIN" plan "${attn_only[@]}" --nodes 1 --ranks-per-node 2 --global-batch 8 \
  --mem-per-rank 8 --tflops 1 >"$TMP/plan_blocks" 2>&1
expect_contains "$TMP/plan_blocks" "$(awk -v p="$psi" 'BEGIN { printf "%.1f M parameters", p / 1e6 }')" \
  "plan's parameter count"
for cmd in "simulate --ddp --ranks 2" "plan --nodes 1 --ranks-per-node 2 --global-batch 8 --mem-per-rank 8"; do
  rc=0
  # shellcheck disable=SC2086
  "$DTRAIN" $cmd --blocks ln_1:layernorm,x:foo >"$TMP/bad_blocks" 2>&1 || rc=$?
  expect_eq "$rc" 2 "exit status of $cmd with an unknown kind"
  expect_contains "$TMP/bad_blocks" "no block kind called 'foo'" "$cmd with an unknown kind"
done

bad() { # want-text args...
    local want=$1 rc=0
    shift
    "$DTRAIN" plan "$@" >"$TMP/bad" 2>&1 || rc=$?
    expect_eq "$rc" 2 "exit status of plan $*"
    expect_contains "$TMP/bad" "$want" "plan $*"
}
check "refusals"
bad "use a multiple of 4" --pp 4 --grad-accum 6 --pp-schedule interleaved
bad "--pp takes 2..64" --pp 1 --grad-accum 4
bad "naive|gpipe|1f1b|interleaved|zb1p" --pp 2 --grad-accum 4 --pp-schedule pipedream
bad "--pp and --grad-accum draw a schedule" --pp 2
bad "chosen by \`dtrain train --pp-partition\`" --pp 2 --grad-accum 4 --pp-partition cost
bad "--pp-virtual takes 1..64" --pp 2 --grad-accum 4 --pp-schedule interleaved --pp-virtual 65
echo "test_plan: ok"
