#!/usr/bin/env bash
# The pipeline's fault requirements (docs/train.md, "Pipeline parallelism"):
#  - a stage killed mid-step ends every rank with an error naming it, well
#    within the deadline (DTRAIN_TIMEOUT, 60 s here): stage 1 and stage 0
#    (rank 0, which serves the store) of a pp 2 run, the middle stage of a
#    pp 3 run;
#  - ranks started with different run-shaping options are refused, every
#    rank naming the option, at once (no waiting for a timeout): --pp,
#    --pp 3 against --pp 2 (a rank that could not run its own), two options
#    at once (--n-layer and --grad-accum), --num-experts, and a rank that refuses its own
#    command line before it joins (--pp 0).
#   test_pp_faults.sh DTRAIN
set -euo pipefail
dtrain=$1
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
# Ours alone: nothing of the caller's job, and a deadline that a fault
# found by waiting for it would show (the bounds below are far under it).
unset DTRAIN_SECRET DTRAIN_JOB_ID DTRAIN_GRACE_PERIOD DTRAIN_TRANSPORT DTRAIN_HEARTBEAT_TIMEOUT \
  MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
export DTRAIN_TIMEOUT=60
BOUND_MS=15000

fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [ -s "$f" ] && { echo "--- $(basename "$f"):"; tail -n 15 "$f"; }; done; exit 1; }
source "$(dirname "$0")/../free_port.sh"
now_ms() { date +%s%3N; }

/usr/bin/python3 - "$tmp/data.txt" <<'PY'
import random, sys
random.seed(5)
words = "one two three four five six seven eight nine ten".split()
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(20000)))
PY
model=(--data "$tmp/data.txt" --n-head 2 --n-embd 32 --block-size 32 --batch-size 2 --threads 1
       --grad-accum 4)

# ---- a stage killed mid-step ------------------------------------------------

# kill_stage NAME NPROC N_LAYER VICTIM: a pp NPROC run under `dtrain launch
# --tag-output`, SIGKILL to rank VICTIM once 3 steps have logged; every
# other rank must then fail, each with an error naming the victim, and the
# launcher exit non-zero, within BOUND_MS of the kill.
kill_stage() {
  local name=$1 n=$2 layers=$3 victim=$4 pid child v= rc=0 t0 ms r
  "$dtrain" launch -n "$n" --tag-output -- "$dtrain" train --pp "$n" --n-layer "$layers" \
    "${model[@]}" --steps 1000000 --eval-batches 1 --print-every 1000 \
    --log-json "$tmp/$name.json" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 600); do
    [ -f "$tmp/$name.json" ] && [ "$(grep -c '"loss"' "$tmp/$name.json")" -ge 3 ] && break
    kill -0 "$pid" 2>/dev/null || fail "$name: the job ended before 3 steps"
    sleep 0.05
  done
  [ "$(grep -c '"loss"' "$tmp/$name.json" 2>/dev/null || true)" -ge 3 ] \
    || fail "$name: no 3 steps logged in 30 s"
  for child in $(pgrep -P "$pid"); do
    tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx "RANK=$victim" && v=$child
  done
  [ -n "$v" ] || fail "$name: rank $victim not found among the launcher's children"
  t0=$(now_ms)
  kill -KILL "$v"
  wait "$pid" || rc=$?
  ms=$(($(now_ms) - t0))
  [ "$rc" -ne 0 ] || fail "$name: the launcher exited 0 although rank $victim was killed"
  [ "$ms" -lt "$BOUND_MS" ] || fail "$name: the job took $ms ms to end after the kill"
  grep -q "dtrain launch: rank $victim (pid $v) was killed by signal 9" "$tmp/$name.err" \
    || fail "$name: the launcher does not name rank $victim as killed"
  for ((r = 0; r < n; r++)); do
    [ "$r" -eq "$victim" ] && continue
    grep -E "^\[$r\]: dtrain train: error: .*rank $victim([^0-9]|$)" "$tmp/$name.err" \
      | grep -qE "was lost|died or was killed" \
      || fail "$name: rank $r has no error naming the lost rank $victim"
  done
  echo "ok: $name: SIGKILL to rank $victim of $n (stage $victim) after 3 steps: exit $rc after $ms ms"
  grep -E "^\[[0-9]+\]: dtrain train: error:" "$tmp/$name.err" | sed 's/^/    /'
}

kill_stage pp2-stage1 2 2 1
kill_stage pp2-stage0 2 2 0
kill_stage pp3-stage1 3 3 1

# ---- options that differ between ranks --------------------------------------

# by_hand NAME "ARGS0" "ARGS1": two ranks started by hand (torchrun's
# variables) with their own flags on a free port; sets RC0, RC1 and MS
# (both ended). A port another test takes between the check and rank 0's
# bind makes rank 0 fail at once ("Address already in use") while rank 1
# would wait out its connect timeout: then rank 1 is stopped and the pair
# starts again on another port.
by_hand() {
  local try
  for try in 1 2 3; do
    start_pair "$@"
    grep -qF "Address already in use" "$tmp/$1.0.err" || return 0
    echo "note: $1: port taken by another process, again on another port"
  done
}

start_pair() {
  local name=$1 port p0 p1 t0
  port=$(free_port)
  t0=$(now_ms)
  local envs=(DTRAIN_SECRET="$name-$$-$RANDOM" DTRAIN_JOB_ID="ppf$$$RANDOM" WORLD_SIZE=2
              LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port)
  # shellcheck disable=SC2086
  env "${envs[@]}" RANK=0 LOCAL_RANK=0 "$dtrain" train "${model[@]}" --steps 3 $2 \
    >"$tmp/$name.0.out" 2>"$tmp/$name.0.err" &
  p0=$!
  # shellcheck disable=SC2086
  env "${envs[@]}" RANK=1 LOCAL_RANK=1 "$dtrain" train "${model[@]}" --steps 3 $3 \
    >"$tmp/$name.1.out" 2>"$tmp/$name.1.err" &
  p1=$!
  pids+=("$p0" "$p1")
  RC0=0 RC1=0
  wait "$p0" || RC0=$?
  if grep -qF "Address already in use" "$tmp/$name.0.err"; then kill "$p1" 2>/dev/null; fi
  wait "$p1" || RC1=$?
  MS=$(($(now_ms) - t0))
}

# differ NAME "ARGS0" "ARGS1" MESSAGE: both ranks exit 1 with MESSAGE.
differ() {
  local name=$1 want=$4 r
  by_hand "$name" "$2" "$3"
  [ "$RC0" -eq 1 ] && [ "$RC1" -eq 1 ] || fail "$name: exit $RC0 and $RC1, want 1 and 1"
  [ "$MS" -lt "$BOUND_MS" ] || fail "$name: took $MS ms"
  for r in 0 1; do
    grep -qF "dtrain train: error: options differ between ranks: $want" "$tmp/$name.$r.err" \
      || fail "$name: rank $r does not say '$want'"
  done
  echo "ok: $name: both ranks refused in $MS ms: $(grep -F 'options differ' "$tmp/$name.0.err")"
}

differ pp-2-1 "--pp 2 --n-layer 2" "--pp 1 --n-layer 2" \
  "--pp is 2 on rank 0 but 1 on rank 1 (start every rank with the same options)"
differ pp-2-3 "--pp 2 --n-layer 2" "--pp 3 --n-layer 2" \
  "--pp is 2 on rank 0 but 3 on rank 1 (start every rank with the same options)"
differ two-options "--pp 2 --n-layer 2" "--pp 2 --n-layer 4 --grad-accum 2" \
  "--n-layer is 2 on rank 0 but 4 on rank 1, and --grad-accum differs too"
differ experts "--n-layer 2 --num-experts 4" "--n-layer 2 --num-experts 8" \
  "--num-experts is 4 on rank 0 but 8 on rank 1 (start every rank with the same options)"

# One layer's blocks in two spellings are the same model: both train.
by_hand same-blocks "--n-layer 2" "--n-layer 2 --blocks ln_1:layernorm,attn:attention,ln_2:layernorm,mlp:mlp"
[ "$RC0" -eq 0 ] && [ "$RC1" -eq 0 ] \
  || fail "same-blocks: exit $RC0 and $RC1, want 0 and 0: $(cat "$tmp/same-blocks.0.err")"
echo "ok: same-blocks: GPT-2's blocks given and left to the default train together"
differ other-blocks "--n-layer 2" "--n-layer 2 --blocks ln_1:layernorm,attn:attention" \
  "--blocks is unset on rank 0 but 'ln_1:layernorm,attn:attention' on rank 1"

# A rank that refuses its own command line never reaches the comparison:
# it joins only to stop the job, so the other fails at once, naming it.
by_hand refused "--pp 2 --n-layer 2" "--pp 0 --n-layer 2"
[ "$RC1" -eq 2 ] || fail "refused: rank 1 exited $RC1, want 2 (usage)"
grep -qF -- "--pp: 0 must be in [1, 64]" "$tmp/refused.1.err" || fail "refused: rank 1's own message"
[ "$RC0" -eq 1 ] || fail "refused: rank 0 exited $RC0, want 1"
grep -qF "rank 1 failed: it refused its command line: --pp: 0 must be in [1, 64]" \
  "$tmp/refused.0.err" || fail "refused: rank 0 does not name rank 1 and its reason"
[ "$MS" -lt "$BOUND_MS" ] || fail "refused: took $MS ms"
echo "ok: refused: rank 1 (--pp 0) exit 2, rank 0 exit 1 in $MS ms: $(cat "$tmp/refused.0.err")"
