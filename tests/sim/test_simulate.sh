#!/usr/bin/env bash
# `dtrain simulate`: what it prints, the trace it writes, and its refusals.
#  - one all-reduce at 8 ranks on one host, ring forced: the simulated time
#    equals the cost model's prediction (no link is shared);
#  - a DDP step of GPT-2 small at 128 ranks writes a trace that parses as
#    JSON, with a sampled set of ranks (fewer than 128) named in it;
#  - bad input exits 2 naming what would work: ranks not a multiple of the
#    ranks per node, an unknown link model, a missing model file, an
#    unknown collective and algorithm, --bytes without --collective's mode;
#  - layouts: what `dtrain train` refuses, refused with train's message, and
#    what it takes (2046 rows over tp 2, interleaved's two chunks) taken;
#  - a schedule too big to record, refused within seconds (not after 32 s
#    and 4.2 GB) naming the ranks or the algorithm that would fit;
#  - progress lines on stderr (at every report with DTRAIN_SIM_PROGRESS_S=0)
#    up to each phase's end, none for a short run, none on stdout;
#  - docs/simulate.md's DDP command, at 80 ranks, places them as the
#    output on the page shows (hosts of 8, 8 NICs each; the links);
#  - link model files with absurd figures (1e-300 GB/s, zero, negative,
#    infinite, huge, not a number) refused naming the field and its range.
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

check "a layout's step with a trace"
"$DTRAIN" simulate --layout --model gpt2 --tp 2 --pp 2 --grad-accum 4 --batch-size 2 \
    --zero-stage 1 --ranks 16 --ranks-per-node 8 --link-model nvlink-ib \
    --trace "$TMP/layout.json" >"$TMP/layout" 2>&1
expect_contains "$TMP/layout" "tp 2 x cp 1 x dp 4 x pp 2, 1f1b, ZeRO-1" "the layout"
expect_contains "$TMP/layout" "bubble 0.200 of the time by the formula" "the bubble formula"
expect_contains "$TMP/layout" "exposed: tp" "exposed communication by kind"
python3 - "$TMP/layout.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
names = {e["name"] for e in d["traceEvents"] if e["ph"] == "X"}
assert {"forward", "backward", "optimizer", "receive activation"} <= names, names
assert any(n.startswith("allreduce") for n in names), names
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
bad "give one of --collective KIND" --ranks 4
bad "--bytes takes a size" --collective allreduce --bytes 1X --ranks 4
L="--layout --model gpt2"
bad "not a multiple of tp x cp x pp = 4 (try --ranks 8)" $L --tp 2 --pp 2 --ranks 6
bad "--tp 5: the model's 12 heads (n_embd 768, MLP width 3072) do not split into 5 equal parts" \
    $L --tp 5 --ranks 5
bad "13 stages (pp 13 x 1 chunks) for 12 layers" $L --pp 13 --ranks 13
bad "--pp-virtual 2 needs --pp-schedule interleaved" $L --pp 2 --pp-virtual 2 --ranks 2
bad "--pp-schedule" $L --pp 2 --pp-schedule fastest --ranks 2
bad "--dp 3: tp x cp x dp x pp = 6, not the 8 ranks (--dp 4 fits)" $L --pp 2 --dp 3 --ranks 8
bad "go with --layout" --ddp --tp 2 --ranks 2

# What `dtrain train` refuses, simulate refuses with train's own message
# (and accepts what train accepts): the same checks, not a copy.
check "layouts train refuses"
agree_bad() { # ranks args...
    local n=$1 rc=0
    shift
    "$DTRAIN" train --dry-run --nproc "$n" --model gpt2 "$@" >"$TMP/train" 2>&1 || rc=$?
    [[ "$rc" -ne 0 ]] || fail "train accepts $*"
    local why
    why=$(sed -n 's/^dtrain train: \(--dry-run: \)\{0,1\}//p' "$TMP/train" | head -1 | cut -c1-60)
    [[ -n "$why" ]] || fail "train's message for $*: $(cat "$TMP/train")"
    bad "$why" $L --ranks "$n" "$@"
}
agree_bad 4 --sequence-parallel
agree_bad 4 --pp-schedule gpipe
agree_bad 4 --pp 2 --zero-stage 2
agree_bad 4 --pp 2 --zero-stage 3
agree_bad 4 --zero-stage 1 --zero-prefetch 2
agree_bad 2 --cp 2 --seq-len 1022
bad "--tp 4: a vocabulary of 5 in slices of 2 rows leaves rank 3 none" \
    $L --tp 4 --vocab-size 5 --ranks 4
bad "--sequence-parallel: the 1023 rows of a micro-batch (B x T) do not split over 2" \
    $L --tp 2 --sequence-parallel --batch-size 1 --seq-len 1023 --ranks 2
check "layouts train accepts"
ok() {
    "$DTRAIN" simulate $L "$@" >"$TMP/ok" 2>&1 || fail "simulate $*: $(cat "$TMP/ok")"
}
ok --pp 2 --pp-schedule interleaved --grad-accum 4 --ranks 2 # two chunks a rank, as train
ok --tp 2 --sequence-parallel --batch-size 2 --seq-len 1023 --ranks 2 # 2046 rows split

check "a schedule too big to record is refused at once, naming what would fit"
t0=$(now_ms)
# (ulimit: before the refusal was made from the counts, this recorded 4.2 GB for 32 s)
(ulimit -v 3000000; bad "no alltoall algorithm's schedule fits at 65536 ranks; at most 18919 \
ranks would, by --algo pairwise" --collective alltoall --bytes 1G --ranks 65536)
ms=$(($(now_ms) - t0))
((ms < 10000)) || fail "the refusal took $ms ms"
if grep -qF -- "--algo auto" "$TMP/bad"; then
    fail "it suggests --algo auto, which it was running: $(cat "$TMP/bad")"
fi
bad "the schedule of allreduce ring over 65536 ranks takes at least 40.0 GiB (8589803520 steps)" \
    --collective allreduce --bytes 1G --ranks 65536 --algo ring
expect_contains "$TMP/bad" "use --algo rhd (of the allreduce algorithms whose schedule fits" \
    "the algorithm named"

check "progress: what a long run is doing, how far it has got, about how long it has left"
# DTRAIN_SIM_PROGRESS_S=0 prints at every report, as a run of minutes does every 10 s.
P="--collective allreduce --bytes 1M --ranks 8192 --ranks-per-node 8 --algo rhd"
C8="--collective allreduce --bytes 1M --ranks 8"
DTRAIN_SIM_PROGRESS_S=0 "$DTRAIN" simulate $P >"$TMP/p.out" 2>"$TMP/p.err"
expect_contains "$TMP/p.err" \
    "dtrain simulate: recording allreduce rhd of 1048576 bytes over 8192 ranks: done in" "recording"
expect_contains "$TMP/p.err" "dtrain simulate: running the simulation: 0% after" "the run begun"
grep -qE "running the simulation: [1-9][0-9]?% after [0-9]+ s" "$TMP/p.err" ||
    fail "no progress within the run: $(cat "$TMP/p.err")"
expect_contains "$TMP/p.err" "dtrain simulate: running the simulation: done in" "the run's end"
expect_contains "$TMP/p.out" "algorithm      rhd" "the report"
if grep -q "dtrain simulate:" "$TMP/p.out"; then fail "progress on stdout: $(cat "$TMP/p.out")"; fi
"$DTRAIN" simulate $C8 >"$TMP/p.out" 2>"$TMP/p.err" # a run of milliseconds: no progress lines
[[ ! -s "$TMP/p.err" ]] || fail "a short run printed progress: $(cat "$TMP/p.err")"
DTRAIN_SIM_PROGRESS_S=soon bad "DTRAIN_SIM_PROGRESS_S=soon is not a number in [0, 3600]" $P

check "docs/simulate.md: its DDP command places ranks as its output shows"
python3 - "$(dirname "$0")/../../docs/simulate.md" "$DTRAIN" <<'PY'
import re, shlex, subprocess, sys
doc, dtrain = sys.argv[1:]
text = open(doc).read()
cmd = re.search(r"^(dtrain simulate --ddp (?:.*\\\n)*.*)$", text, re.M).group(1)
args = shlex.split(cmd.replace("\\\n", " "))[2:]
for flag in ("--trace", "--trace-ranks"):  # nothing written here
    if flag in args:
        del args[args.index(flag):args.index(flag) + 2]
args[args.index("--ranks") + 1] = "80"  # the same hosts, fewer of them
out = subprocess.run([dtrain, "simulate"] + args, capture_output=True, text=True, check=True)
shown = [b for b in text.split("```") if "\nbuckets " in b][0]
place = r"^ranks +\d+ \(\d+ hosts of (\d+), (\d+ NICs? each)\)$"
want = re.search(place, shown, re.M).groups()
got = re.search(place, out.stdout, re.M).groups()
assert got == want, f"the page's command gives {got}, its output shows {want}: {cmd}"
links = lambda t: re.search(r"^links .*$", t, re.M).group(0)
assert links(out.stdout) == links(shown), (links(out.stdout), links(shown))
PY

check "link model files: absurd figures refused, naming the field and its range"
model() { # copy_GBps shm-bandwidth tcp-alpha
    printf '{"format": "dtrain-comm-model/1", "copy_GBps": %s, "links": {"shm": {"alpha_us": 1,
 "bandwidth_GBps": %s, "reduce_GBps": 10}, "tcp": {"alpha_us": %s, "bandwidth_GBps": 10,
 "reduce_GBps": 10}}}\n' "$1" "$2" "$3" >"$TMP/m.json"
}
C="--collective allreduce --bytes 1M --ranks 4 --link-model $TMP/m.json"
model 10 10 5
"$DTRAIN" simulate $C >"$TMP/ok" 2>&1 || fail "a sensible model file: $(cat "$TMP/ok")"
model 10 1e-300 5
bad "links.shm.bandwidth_GBps is 1e-300; it must be a number from 0.001 to 10000" $C
model 10 1e300 5
bad "links.shm.bandwidth_GBps is 1e+300; it must be a number from 0.001 to 10000" $C
model 10 -3 5
bad "links.shm.bandwidth_GBps is -3; it must be" $C
model 10 0 5
bad "links.shm.bandwidth_GBps is 0; it must be" $C
model 10 1e999 5 # JSON's only infinity: a literal too large for a double
bad "links.shm.bandwidth_GBps is inf; it must be" $C
model 10 10 1e9
bad "links.tcp.alpha_us is 1e+09; it must be a number from 0.001 to 100000 (microseconds" $C
model 1e-300 10 5
bad "copy_GBps is 1e-300; it must be a number from 0.001 to 10000 (GB/s" $C
model '"fast"' 10 5
bad "copy_GBps is not a number; it must be" $C
echo "test_simulate: ok"
