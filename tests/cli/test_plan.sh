#!/usr/bin/env bash
# `dtrain plan`: the chart of a pipeline schedule, and its refusals.
#  - 1f1b at p 4, M 8: four rank rows; the bubble (p-1)/(M+p-1) = 3/11
#    written here, not taken from the program; rank r holds p - r
#    micro-batches at most.
#  - gpipe at p 2, M 3: rank 0 runs its three forwards first.
#  - bad input exits 2 naming what would work: interleaved with M not a
#    multiple of p, --pp 1, an unknown schedule, a missing --grad-accum,
#    --pp-partition (the chart is in unit time; `dtrain train` chooses).
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
echo "test_plan: ok"
