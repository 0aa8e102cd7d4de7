#!/usr/bin/env bash
# Restarts (--max-restarts K): after a failure the other ranks are killed at
# once and all start again as the same job (id, secret, port) with the
# attempt and the failure in their environment; after K restarts the next
# failure ends the job; a stop signal never restarts; the job's comm
# segments go between attempts, its snapshot directory only at the end.
# Then one real 2-rank job of the comm library (test_faults) whose rank 1 is
# killed with SIGKILL, which needs rank 0's store to bind its port again.
#
# Usage: test_launch_restart.sh path/to/dtrain path/to/test_faults
set -euo pipefail
source "$(dirname "$0")/lib.sh"
FAULTS=${2:?usage: $0 path/to/dtrain path/to/test_faults}
[[ -x "$FAULTS" ]] || fail "$FAULTS is not an executable"
unset DTRAIN_FAILURE DTRAIN_FAILED_RANK DTRAIN_FAILURE_NS
unset TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS

# A rank: writes what it saw to $SEEN/R.ATTEMPT, then behaves as $MODE says.
# In attempt 0 every rank makes a comm segment of the job and rank 0 a
# snapshot directory; later attempts report what they find of both.
cat >"$TMP/rank.sh" <<'EOF'
a=$TORCHELASTIC_RESTART_COUNT
f="$SEEN/$RANK.$a"
snap="/dev/shm/dtrain-snap-$DTRAIN_JOB_ID"
{
    echo "COUNT=$a"
    echo "MAX=$TORCHELASTIC_MAX_RESTARTS"
    echo "FAILED_RANK=${DTRAIN_FAILED_RANK-unset}"
    echo "FAILURE=${DTRAIN_FAILURE-unset}"
    echo "FAILURE_NS=${DTRAIN_FAILURE_NS-unset}"
    echo "JOB=$DTRAIN_JOB_ID"
    echo "PORT=$MASTER_PORT"
    echo "NOW_NS=$(python3 -c 'import time; print(time.monotonic_ns())')"
} >"$f.tmp"
if [[ $a == 0 ]]; then
    : >"/dev/shm/dtrain-$DTRAIN_JOB_ID-restarttest$RANK"
    if [[ $RANK == 0 ]]; then mkdir -p "$snap" && echo step5 >"$snap/latest"; fi
else
    echo "SNAP=$(cat "$snap/latest" 2>/dev/null || echo none)" >>"$f.tmp"
    echo "SEGS=$(find /dev/shm -maxdepth 1 -name "dtrain-$DTRAIN_JOB_ID-*" | wc -l)" >>"$f.tmp"
fi
mv "$f.tmp" "$f"
case $MODE in
once-kill) # rank 1 dies in attempt 0, once the others are waiting
    if [[ $a == 0 ]]; then
        if [[ $RANK == 1 ]]; then sleep 0.3; kill -9 $$; fi
        exec sleep 30
    fi ;;
always-3) # rank 1 fails in every attempt
    if [[ $RANK == 1 ]]; then exit 3; fi
    exec sleep 30 ;;
sleep) exec sleep 30 ;;
esac
exit 0
EOF

run_case() { # name mode launch-args...: sets rc; stderr in $TMP/name.err
    local name=$1 mode=$2
    shift 2
    export SEEN="$TMP/$name" MODE=$mode
    mkdir -p "$SEEN"
    rc=0
    "$DTRAIN" launch "$@" -- bash "$TMP/rank.sh" 2>"$TMP/$name.err" || rc=$?
}

check "K=3, rank 1 killed in attempt 0: the others are killed at once, all start again as" \
    "the same job with the failure in their environment, exit 0"
t0=$(now_ms)
run_case once once-kill -n 3 --max-restarts 3 --grace-period 60
ms=$(($(now_ms) - t0))
expect_eq "$rc" 0 "exit status"
expect_eq "$(attempts "$SEEN" | tr '\n' ' ')" "0 1 " "attempts"
# A restart gives the others no grace period (60 s here): far below it,
# with room for a loaded machine.
[[ $ms -lt 20000 ]] || fail "took $ms ms: the other ranks were not killed at once"
expect_contains "$TMP/once.err" "dtrain launch: rank 1 (pid " "failure line"
expect_contains "$TMP/once.err" ") was killed by signal 9 (Killed)" "failure line"
expect_contains "$TMP/once.err" "dtrain launch: restart 1 of 3: starting the 3 ranks again" \
    "restart line"
job=$(field "$SEEN/0.0" JOB)
port=$(field "$SEEN/0.0" PORT)
[[ -n "$job" && -n "$port" ]] || fail "no job id or port in $SEEN/0.0"
for r in 0 1 2; do
    expect_eq "$(field "$SEEN/$r.0" COUNT)" 0 "rank $r, attempt 0: TORCHELASTIC_RESTART_COUNT"
    expect_eq "$(field "$SEEN/$r.0" MAX)" 3 "rank $r, attempt 0: TORCHELASTIC_MAX_RESTARTS"
    expect_eq "$(field "$SEEN/$r.0" FAILED_RANK)" unset "rank $r, attempt 0: DTRAIN_FAILED_RANK"
    expect_eq "$(field "$SEEN/$r.0" FAILURE)" unset "rank $r, attempt 0: DTRAIN_FAILURE"
    expect_eq "$(field "$SEEN/$r.0" FAILURE_NS)" unset "rank $r, attempt 0: DTRAIN_FAILURE_NS"
    s="$SEEN/$r.1"
    expect_eq "$(field "$s" COUNT)" 1 "rank $r, attempt 1: TORCHELASTIC_RESTART_COUNT"
    expect_eq "$(field "$s" MAX)" 3 "rank $r, attempt 1: TORCHELASTIC_MAX_RESTARTS"
    expect_eq "$(field "$s" FAILED_RANK)" 1 "rank $r, attempt 1: DTRAIN_FAILED_RANK"
    expect_eq "$(field "$s" FAILURE)" "killed by signal 9 (Killed)" "rank $r: DTRAIN_FAILURE"
    expect_eq "$(field "$s" JOB)" "$job" "rank $r, attempt 1: DTRAIN_JOB_ID"
    expect_eq "$(field "$s" PORT)" "$port" "rank $r, attempt 1: MASTER_PORT"
    expect_eq "$(field "$s" SNAP)" step5 "rank $r, attempt 1: the snapshot directory"
    expect_eq "$(field "$s" SEGS)" 0 "rank $r, attempt 1: comm segments of attempt 0 left"
    # CLOCK_MONOTONIC: after rank 1 began attempt 0 (it dies after writing
    # its record) and before this rank began attempt 1. Causal bounds, not
    # a time limit: a loaded machine may take seconds to start a rank.
    fns=$(field "$s" FAILURE_NS)
    now=$(field "$s" NOW_NS)
    born=$(field "$SEEN/1.0" NOW_NS)
    [[ "$fns" =~ ^[0-9]+$ ]] || fail "rank $r: DTRAIN_FAILURE_NS='$fns' is not a number"
    ((born < fns && fns <= now)) ||
        fail "rank $r: DTRAIN_FAILURE_NS=$fns, not between rank 1's start ($born) and this rank's restart ($now) (monotonic ns)"
done
[[ ! -e "/dev/shm/dtrain-snap-$job" ]] || fail "the snapshot directory outlived the job"
left=$(find /dev/shm -maxdepth 1 -name "dtrain-$job-*" | wc -l)
expect_eq "$left" 0 "comm segments of the job left in /dev/shm"

check "K=1 (--max_restarts=1), rank 1 always exits 3: two attempts, then exit 3, giving up," \
    "the snapshot directory removed"
# Rank 0 may be killed before it makes the directory: make it here.
job="restarttest$$"
mkdir "/dev/shm/dtrain-snap-$job"
echo step7 >"/dev/shm/dtrain-snap-$job/latest"
t0=$(now_ms)
DTRAIN_JOB_ID=$job run_case always always-3 -n 2 --max_restarts=1 --grace-period 0.3
ms=$(($(now_ms) - t0))
expect_eq "$rc" 3 "exit status"
expect_eq "$(attempts "$SEEN" | tr '\n' ' ')" "0 1 " "attempts"
expect_contains "$TMP/always.err" "dtrain launch: restart 1 of 1: starting the 2 ranks again" \
    "restart line"
expect_contains "$TMP/always.err" "dtrain launch: rank 1 failed again after 1 restart; giving up" \
    "giving-up line"
# The last attempt follows the usual policy: the grace period, then SIGTERM.
expect_contains "$TMP/always.err" "still running 0.3s after the failure; sending SIGTERM" \
    "grace period of the last attempt"
# Far below rank 0's 30 s sleep, which SIGTERM ends (two attempts took
# 1.4 s alone and 3.2 s beside the rest of the suite on a Zen 5 VM).
[[ $ms -lt 10000 ]] || fail "took $ms ms: rank 0 was not sent SIGTERM after the grace period"
[[ ! -e "/dev/shm/dtrain-snap-$job" ]] || fail "the snapshot directory outlived a failed job"

check "no --max-restarts (and --max-restarts 0): one attempt, fail fast as before"
for args in "" "--max-restarts 0"; do
    rm -rf "$TMP/zero"
    # shellcheck disable=SC2086
    run_case zero always-3 -n 2 --grace-period 0.3 $args
    expect_eq "$rc" 3 "exit status ($args)"
    expect_eq "$(attempts "$SEEN" | tr '\n' ' ')" "0 " "attempts ($args)"
    expect_eq "$(field "$SEEN/0.0" MAX)" 0 "TORCHELASTIC_MAX_RESTARTS ($args)"
    expect_eq "$(field "$SEEN/0.0" COUNT)" 0 "TORCHELASTIC_RESTART_COUNT ($args)"
    if grep -qE "restart|giving up" "$TMP/zero.err"; then
        cat "$TMP/zero.err" >&2
        fail "a job without restarts talks of restarts ($args)"
    fi
done

check "SIGTERM to the launcher with K=3: no restart, exit 143"
export SEEN="$TMP/term" MODE=sleep
mkdir -p "$SEEN"
"$DTRAIN" launch -n 2 --max-restarts 3 -- bash "$TMP/rank.sh" 2>"$TMP/term.err" &
launcher=$!
for _ in $(seq 1 100); do
    [[ -e "$SEEN/0.0" && -e "$SEEN/1.0" ]] && break
    sleep 0.05
done
kill -TERM "$launcher"
rc=0
wait "$launcher" || rc=$?
expect_eq "$rc" 143 "exit status"
expect_eq "$(attempts "$SEEN" | tr '\n' ' ')" "0 " "attempts"

check "bad values are refused with exit 2"
bad "invalid value '-1' for --max-restarts: expected an integer from 0 to 1000" --max-restarts -1
bad "invalid value 'abc' for --max_restarts: expected an integer from 0 to 1000" --max_restarts abc
bad "invalid value '1001' for --max-restarts" --max-restarts=1001
DTRAIN_SECRET=0123456789abcdef0123456789abcdef "$DTRAIN" launch --nnodes 2 --node-rank 1 \
    --master-addr 127.0.0.1 --max-restarts 0 -- true || fail "--max-restarts 0 with --nnodes 2"

check "dtrain train --nproc 2 --max-restarts 1 passes K to the launch"
rc=0
"$DTRAIN" train --nproc 2 --max-restarts 1 --no-such-flag >/dev/null 2>"$TMP/train.err" || rc=$?
expect_eq "$rc" 2 "exit status"
expect_contains "$TMP/train.err" "dtrain launch: restart 1 of 1: starting the 2 ranks again" \
    "restart line"
expect_contains "$TMP/train.err" "failed again after 1 restart; giving up" "giving-up line"
rc=0
"$DTRAIN" train --max-restarts 1 --steps 1 >/dev/null 2>"$TMP/train1.err" || rc=$?
expect_eq "$rc" 2 "exit status without --nproc"
expect_contains "$TMP/train1.err" "--max-restarts works with --nproc N" "message"
expect_contains "$TMP/train1.err" "dtrain launch --max-restarts 1" "message"

check "a real 2-rank job (test_faults stream), rank 1 killed with SIGKILL: rank 0's store" \
    "binds its port again, the job restarts and ends 0"
export E2E="$TMP/e2e"
mkdir -p "$E2E"
# Both attempts stream until told to stop, which the script does once the
# restart has begun (20 all-reduces at least).
DTRAIN_TIMEOUT=10 DTRAIN_FAULT_UNTIL="$E2E/stop" \
    "$DTRAIN" launch -n 2 --max-restarts 1 -- bash -c \
    'export DTRAIN_FAULT_PIDDIR="$E2E/a$TORCHELASTIC_RESTART_COUNT"; mkdir -p "$DTRAIN_FAULT_PIDDIR"
     echo "$MASTER_PORT" >"$DTRAIN_FAULT_PIDDIR/port$RANK"
     exec "$0" stream 20 5' "$FAULTS" >"$E2E/out" 2>"$E2E/err" &
launcher=$!
for _ in $(seq 1 200); do
    grep -q "^rank 1: stream: " "$E2E/out" && break
    sleep 0.05
done
grep -q "^rank 1: stream: " "$E2E/out" || { cat "$E2E/err" >&2; fail "attempt 0 did not stream"; }
kill -KILL "$(cat "$E2E/a0/rank1.pid")"
for _ in $(seq 1 200); do
    grep -q "restart 1 of 1" "$E2E/err" && break
    sleep 0.05
done
: >"$E2E/stop"
rc=0
wait "$launcher" || rc=$?
expect_eq "$rc" 0 "exit status"
expect_contains "$E2E/err" "dtrain launch: restart 1 of 1: starting the 2 ranks again" \
    "restart line"
for r in 0 1; do
    expect_contains "$E2E/out" "rank $r: stream: finished " "attempt 1, rank $r"
    expect_eq "$(cat "$E2E/a1/port$r")" "$(cat "$E2E/a0/port$r")" "rank $r: MASTER_PORT"
done

grep "^dtrain launch: " "$E2E/err" | sed "s/^/  /"
echo "ok"
