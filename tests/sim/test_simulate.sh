#!/usr/bin/env bash
# `dtrain simulate`: what it prints, the trace it writes, and its refusals.
#  - one all-reduce at 8 ranks on one host, ring forced: the simulated time
#    equals the cost model's prediction (no link is shared);
#  - a DDP step of GPT-2 small at 128 ranks writes a trace that parses as
#    JSON, with a sampled set of ranks (fewer than 128) named in it;
#  - bad input exits 2 naming what would work: ranks not a multiple of the
#    ranks per node, an unknown link model, a missing model file, an
#    unknown collective and algorithm, --bytes without --collective's mode.
set -euo pipefail
source "$(dirname "$0")/../cli/lib.sh"

check "ring all-reduce, 8 ranks on one host"
"$DTRAIN" simulate --collective allreduce --bytes 64M --ranks 8 --ranks-per-node 8 \
    --algo ring --link-model nvlink-ib >"$TMP/ring" 2>&1
expect_contains "$TMP/ring" "algorithm      ring" "the algorithm"
sim=$(awk '/^simulated/ {print $2}' "$TMP/ring")
pred=$(awk '/^predicted/ {print $2}' "$TMP/ring")
expect_eq "$sim" "$pred" "simulated against predicted"

check "DDP step with a trace"
"$DTRAIN" simulate --ddp --model gpt2 --batch-size 4 --ranks 128 --ranks-per-node 8 \
    --link-model nvlink-ib --trace "$TMP/step.json" --trace-ranks 16 >"$TMP/ddp" 2>&1
expect_contains "$TMP/ddp" "step " "the step time"
expect_contains "$TMP/ddp" "exposed comm" "the breakdown"
expect_contains "$TMP/ddp" "of 128 (a sample" "the sample stated"
python3 - "$TMP/step.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
shown = d["otherData"]["ranks_shown"]
assert 0 < len(shown) < 128, shown
pids = {e["pid"] for e in d["traceEvents"] if e["ph"] == "X"}
assert pids == set(shown), (sorted(pids), shown)
names = {e["name"] for e in d["traceEvents"] if e["ph"] == "X"}
assert {"forward", "backward", "optimizer", "step"} <= names, names
PY

bad() { # want-text args...
    local want=$1 rc=0
    shift
    "$DTRAIN" simulate "$@" >"$TMP/bad" 2>&1 || rc=$?
    expect_eq "$rc" 2 "exit status of simulate $*"
    expect_contains "$TMP/bad" "$want" "simulate $*"
}
check "refusals"
bad "(try --ranks 104)" --collective allreduce --bytes 1M --ranks 100 --ranks-per-node 8
bad "neither a preset (builtin, nvlink-ib" --collective allreduce --bytes 1M --ranks 4 \
    --link-model infiniband
bad "$TMP/none.json" --collective allreduce --bytes 1M --ranks 4 --link-model "$TMP/none.json"
bad "not one of allreduce, reduce_scatter" --collective allsum --bytes 1M --ranks 4
bad "(choices: auto, ring, rhd" --collective allreduce --bytes 1M --ranks 4 --algo fastest
bad "--bytes goes with --collective" --ddp --bytes 1M --ranks 4
bad "--ranks P is needed" --collective allreduce --bytes 1M
bad "give either --collective KIND" --ranks 4
bad "--bytes takes a size" --collective allreduce --bytes 1X --ranks 4
echo "test_simulate: ok"
