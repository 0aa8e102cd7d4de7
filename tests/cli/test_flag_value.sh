#!/usr/bin/env bash
# `--flag=value` in the commands that read their own flags (cli/flag_value.c),
# as `dtrain train` and `dtrain launch` take it:
#  - `dtrain plan`'s chart and layout forms print the same with --flag=value
#    as with --flag value (the layout form as JSON, less its own timing);
#  - `dtrain simulate` likewise, for a collective and a DDP step;
#  - a flag that takes no value refuses one, exit 2, naming it;
#  - `dtrain plan --help` shows both forms: the layout planner's flags and
#    the chart's.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

same() { # what, then the two command lines separated by ---
    local what=$1 a=() b=() side=a
    shift
    for x in "$@"; do
        if [[ "$x" == --- ]]; then side=b; elif [[ $side == a ]]; then a+=("$x"); else b+=("$x"); fi
    done
    "$DTRAIN" "${a[@]}" >"$TMP/a" 2>&1 || fail "$what: ${a[*]} exits $?: $(tail -2 "$TMP/a")"
    "$DTRAIN" "${b[@]}" >"$TMP/b" 2>&1 || fail "$what: ${b[*]} exits $?: $(tail -2 "$TMP/b")"
    # the commands' own wall times differ from run to run
    sed -i -E '/"seconds"|steps recorded|weighed |s recording, /d' "$TMP/a" "$TMP/b"
    [[ -s "$TMP/a" ]] || fail "$what: no output"
    diff "$TMP/a" "$TMP/b" >&2 || fail "$what: --flag=value prints otherwise"
}

check "plan, the chart"
same "plan chart" plan --pp 4 --grad-accum 8 --pp-schedule zb1p --- \
    plan --pp=4 --grad-accum=8 --pp-schedule=zb1p
check "plan, the layouts"
L=(--global-batch 16 --nodes 1 --ranks-per-node 2 --mem-per-rank 8 --tflops 1 --top 2 --json)
same "plan layouts" plan --model bench "${L[@]}" --tp 2 --- \
    plan --model=bench --global-batch=16 --nodes=1 --ranks-per-node=2 --mem-per-rank=8 \
    --tflops=1 --top=2 --json --tp=2
grep -q '"tp":	2' "$TMP/b" || fail "plan --tp=2 weighed other layouts: $(head -20 "$TMP/b")"
check "simulate"
same "simulate collective" simulate --collective allreduce --ranks 4 --bytes 1M --- \
    simulate --collective=allreduce --ranks=4 --bytes=1M
same "simulate ddp" simulate --ddp --ranks 2 --model tiny --vocab-size 64 --- \
    simulate --ddp --ranks=2 --model=tiny --vocab-size=64

check "a flag without a value refuses one"
for cmd in "plan --json=1 --model bench ${L[*]}" "simulate --ddp=1 --ranks 2"; do
    rc=0
    # shellcheck disable=SC2086
    "$DTRAIN" $cmd >"$TMP/bad" 2>&1 || rc=$?
    expect_eq "$rc" 2 "exit status of $cmd"
    expect_contains "$TMP/bad" "takes no value" "$cmd"
done

check "plan --help shows both forms"
"$DTRAIN" plan --help >"$TMP/help"
for flag in --global-batch --nodes --ranks-per-node --mem-per-rank --tflops --zero-stage \
    --grad-accum --pp-virtual --pp-schedule "--flag=value"; do
    expect_contains "$TMP/help" "$flag" "plan --help"
done
echo "test_flag_value: ok"
