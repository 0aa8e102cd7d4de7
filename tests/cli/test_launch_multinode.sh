#!/usr/bin/env bash
# Restarts on several nodes (--max-restarts K with --nnodes 2): two
# launchers on this machine, node 0 and node 1, whose ranks are small
# shell commands that fail on purpose. A failure on either node restarts
# both, with the same restart count and the same failed rank on both, and
# each attempt's ranks get the attempt's own secret (HMAC-SHA256 of the
# job's secret and "dtrain attempt K", computed here with Python's hmac).
# When the restarts are used up, or one launcher is stopped, both
# launchers end non-zero; when node 0's launcher is killed, node 1's says
# its store is gone and ends. Flags or secrets that differ between the
# nodes are refused. Then a real 2-node job of the comm library
# (test_faults) whose rank 0 is killed with SIGKILL: the store, served by
# node 0's launcher, outlives it, and the next attempt streams to the end.
#
# Usage: test_launch_multinode.sh path/to/dtrain path/to/test_faults
set -euo pipefail
source "$(dirname "$0")/lib.sh"
FAULTS=${2:?usage: $0 path/to/dtrain path/to/test_faults}
[[ -x "$FAULTS" ]] || fail "$FAULTS is not an executable"
unset DTRAIN_FAILURE DTRAIN_FAILED_RANK DTRAIN_FAILURE_NS DTRAIN_STORE_SERVER DTRAIN_TIMEOUT
unset TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS DTRAIN_HEARTBEAT_TIMEOUT
SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export DTRAIN_SECRET=$SECRET

# Launchers still running when the script ends (a failed check) go, and
# their ranks with them (parent-death signal).
LAUNCHERS=""
end_launchers() {
    local p
    for p in $LAUNCHERS; do kill -KILL "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap end_launchers EXIT

# A rank: writes what it saw to $SEEN/R.ATTEMPT and its pid to
# $SEEN/pidR.ATTEMPT, then behaves as $MODE says.
cat >"$TMP/rank.sh" <<'EOF'
a=$TORCHELASTIC_RESTART_COUNT
f="$SEEN/$RANK.$a"
{
    echo "NODE=$NODE_RANK"
    echo "COUNT=$a"
    echo "FAILED_RANK=${DTRAIN_FAILED_RANK-unset}"
    echo "FAILURE=${DTRAIN_FAILURE-unset}"
    echo "FAILURE_NS=${DTRAIN_FAILURE_NS-unset}"
    echo "SECRET=$DTRAIN_SECRET"
    echo "SERVER=${DTRAIN_STORE_SERVER-unset}"
    echo "NOW_NS=$(python3 -c 'import time; print(time.monotonic_ns())')"
} >"$f.tmp"
mv "$f.tmp" "$f"
echo $$ >"$SEEN/pid$RANK.$a"
others_seen() { # a rank fails once every rank of the attempt has written its file
    for ((r = 0; r < WORLD_SIZE; r++)); do
        for _ in $(seq 1 200); do [[ -e "$SEEN/$r.$a" ]] && break; sleep 0.05; done
    done
}
case $MODE in
node1-exits-3) # rank 3, on node 1, exits 3 in attempt 0
    if [[ $a == 0 ]]; then
        if [[ $RANK == 3 ]]; then others_seen; exit 3; fi
        exec sleep 30
    fi ;;
rank0-killed) # rank 0, on node 0, is killed in attempt 0
    if [[ $a == 0 ]]; then
        if [[ $RANK == 0 ]]; then others_seen; kill -9 $$; fi
        exec sleep 30
    fi ;;
always-3) # rank 1, on node 1, exits 3 in every attempt
    if [[ $RANK == 1 ]]; then others_seen; exit 3; fi
    exec sleep 30 ;;
sleep) exec sleep 30 ;;
esac
exit 0
EOF

source "$(dirname "$0")/../free_port.sh"
attempt_secret() { # attempt: the secret its ranks must see
    python3 -c 'import hashlib, hmac, sys
print(hmac.new(sys.argv[1].encode(), b"dtrain attempt " + sys.argv[2].encode(),
               hashlib.sha256).hexdigest())' "$SECRET" "$1"
}
# wait_bounded PID SECONDS: sets RC; a launcher that outlives the bound hangs.
wait_bounded() {
    local t0
    t0=$(now_ms)
    while alive "$1"; do
        (($(now_ms) - t0 < $2 * 1000)) || fail "launcher $1 still runs after $2 s: a hang"
        sleep 0.05
    done
    RC=0
    wait "$1" || RC=$?
}
# start_node NAME NODE LAUNCH-ARGS...: node NODE's launcher in the
# background, stderr in $TMP/NAME.NODE.err, its pid in PID0 or PID1.
start_node() {
    local name=$1 node=$2
    shift 2
    "$DTRAIN" launch --nnodes 2 --node-rank "$node" --master-addr 127.0.0.1 --master-port "$PORT" \
        "$@" -- bash "$TMP/rank.sh" 2>"$TMP/$name.$node.err" &
    eval "PID$node=$!"
    LAUNCHERS="$LAUNCHERS $!"
}
# run_pair NAME MODE LAUNCH-ARGS...: both nodes with the same arguments;
# sets RC0, RC1 and MS (how long the pair took).
run_pair() {
    local name=$1 t0
    export SEEN="$TMP/$name" MODE=$2
    shift 2
    mkdir -p "$SEEN"
    PORT=$(free_port)
    t0=$(now_ms)
    start_node "$name" 0 "$@"
    start_node "$name" 1 "$@"
    wait_bounded "$PID0" 20
    RC0=$RC
    wait_bounded "$PID1" 20
    RC1=$RC
    MS=$(($(now_ms) - t0))
}

check "rank 3 (node 1) exits 3 in attempt 0: both nodes restart once, with the same count," \
    "failed rank and failure, and each attempt's own secret; both exit 0"
run_pair restart node1-exits-3 -n 2 --max-restarts 2 --grace-period 60
expect_eq "$RC0" 0 "node 0's exit status"
expect_eq "$RC1" 0 "node 1's exit status"
expect_eq "$(attempts "$SEEN" | tr '\n' ' ')" "0 1 " "attempts"
# No grace period (60 s here) before a restart, on either node.
[[ $MS -lt 15000 ]] || fail "took $MS ms: the ranks were not killed at once"
expect_contains "$TMP/restart.1.err" "dtrain launch: rank 3 (pid " "node 1's failure line"
expect_contains "$TMP/restart.0.err" "dtrain launch: rank 3 on node 1 exited with status 3; " \
    "node 0's line about node 1's failure"
for n in 0 1; do
    expect_contains "$TMP/restart.$n.err" "dtrain launch: restart 1 of 2: starting the 2 ranks" \
        "node $n's restart line"
done
s0=$(attempt_secret 0)
s1=$(attempt_secret 1)
[[ "$s0" != "$s1" && "$s0" != "$SECRET" ]] || fail "the attempts' secrets do not differ"
for r in 0 1 2 3; do
    expect_eq "$(field "$SEEN/$r.0" NODE)" $((r / 2)) "rank $r: NODE_RANK"
    expect_eq "$(field "$SEEN/$r.0" SERVER)" launcher "rank $r: DTRAIN_STORE_SERVER"
    expect_eq "$(field "$SEEN/$r.0" SECRET)" "$s0" "rank $r, attempt 0: DTRAIN_SECRET"
    expect_eq "$(field "$SEEN/$r.0" FAILED_RANK)" unset "rank $r, attempt 0: DTRAIN_FAILED_RANK"
    s="$SEEN/$r.1"
    expect_eq "$(field "$s" COUNT)" 1 "rank $r, attempt 1: TORCHELASTIC_RESTART_COUNT"
    expect_eq "$(field "$s" SECRET)" "$s1" "rank $r, attempt 1: DTRAIN_SECRET"
    expect_eq "$(field "$s" FAILED_RANK)" 3 "rank $r, attempt 1: DTRAIN_FAILED_RANK"
    expect_eq "$(field "$s" FAILURE)" "exited with status 3" "rank $r, attempt 1: DTRAIN_FAILURE"
    # CLOCK_MONOTONIC (one machine here): when this node's launcher saw
    # the failure or learned of it: after rank 3 began attempt 0 (it exits
    # after writing its record), before this rank began attempt 1.
    fns=$(field "$s" FAILURE_NS)
    now=$(field "$s" NOW_NS)
    born=$(field "$SEEN/3.0" NOW_NS)
    [[ "$fns" =~ ^[0-9]+$ ]] || fail "rank $r: DTRAIN_FAILURE_NS='$fns' is not a number"
    ((born < fns && fns <= now)) ||
        fail "rank $r: DTRAIN_FAILURE_NS=$fns, not between rank 3's start ($born) and this rank's restart ($now) (monotonic ns)"
done

check "rank 0 (node 0) killed with SIGKILL in attempt 0: both nodes restart, and attempt 1" \
    "runs and succeeds"
run_pair kill0 rank0-killed -n 1 --max-restarts 1
expect_eq "$RC0" 0 "node 0's exit status"
expect_eq "$RC1" 0 "node 1's exit status"
expect_eq "$(attempts "$SEEN" | tr '\n' ' ')" "0 1 " "attempts"
expect_contains "$TMP/kill0.0.err" ") was killed by signal 9 (Killed)" "node 0's failure line"
expect_contains "$TMP/kill0.1.err" \
    "dtrain launch: rank 0 on node 0 was killed by signal 9 (Killed); stopping this node's 1 rank" \
    "node 1's line about node 0's failure"
for r in 0 1; do
    expect_eq "$(field "$SEEN/$r.1" FAILED_RANK)" 0 "rank $r, attempt 1: DTRAIN_FAILED_RANK"
    expect_eq "$(field "$SEEN/$r.1" FAILURE)" "killed by signal 9 (Killed)" \
        "rank $r, attempt 1: DTRAIN_FAILURE"
done

check "restarts used up (K=1, rank 1 on node 1 always exits 3): both launchers end non-zero," \
    "node 1 with the rank's status, node 0 naming node 1's rank and failure"
run_pair used always-3 -n 1 --max-restarts 1 --grace-period 0.3
expect_eq "$RC1" 3 "node 1's exit status"
expect_eq "$RC0" 3 "node 0's exit status (the failed rank's)"
expect_eq "$(attempts "$SEEN" | tr '\n' ' ')" "0 1 " "attempts"
expect_contains "$TMP/used.1.err" "dtrain launch: rank 1 failed again after 1 restart; giving up" \
    "node 1's giving-up line"
expect_contains "$TMP/used.0.err" \
    "the job failed on node 1 and ends (restarts used: 1 of 1): rank 1 exited with status 3" \
    "node 0's line"
# The last attempt's other ranks get the usual policy, on both nodes.
expect_contains "$TMP/used.0.err" "still running 0.3s after the failure; sending SIGTERM" \
    "node 0's grace period"

check "node 0's launcher killed with SIGKILL: node 1's launcher says the store is gone, ends" \
    "its rank and exits non-zero at once"
export SEEN="$TMP/lost" MODE=sleep
mkdir -p "$SEEN"
PORT=$(free_port)
start_node lost 0 -n 1 --max-restarts 3
start_node lost 1 -n 1 --max-restarts 3
for _ in $(seq 1 200); do
    [[ -e "$SEEN/pid0.0" && -e "$SEEN/pid1.0" ]] && break
    sleep 0.05
done
[[ -e "$SEEN/pid1.0" ]] || fail "the ranks did not start"
kill -KILL "$PID0"
t0=$(now_ms)
wait_bounded "$PID1" 10
ms=$(($(now_ms) - t0))
[[ $RC -ne 0 ]] || fail "node 1's launcher exited 0 after node 0's was killed"
[[ $ms -lt 5000 ]] || fail "node 1's launcher took $ms ms to notice"
expect_contains "$TMP/lost.1.err" \
    "lost the connection to node 0's store at 127.0.0.1:$PORT: node 0's launcher is gone" \
    "node 1's message"
for r in 0 1; do
    pid=$(cat "$SEEN/pid$r.0")
    for _ in $(seq 1 40); do alive "$pid" || break; sleep 0.05; done
    ! alive "$pid" || fail "rank $r (pid $pid) outlived the launchers"
done
wait "$PID0" 2>/dev/null || true

check "SIGTERM to node 1's launcher with K=3: no restart on either node, both exit 143"
export SEEN="$TMP/term" MODE=sleep
mkdir -p "$SEEN"
PORT=$(free_port)
start_node term 0 -n 1 --max-restarts 3 --grace-period 0.3
start_node term 1 -n 1 --max-restarts 3 --grace-period 0.3
for _ in $(seq 1 200); do
    [[ -e "$SEEN/pid0.0" && -e "$SEEN/pid1.0" ]] && break
    sleep 0.05
done
[[ -e "$SEEN/pid0.0" && -e "$SEEN/pid1.0" ]] || fail "the ranks did not start"
kill -TERM "$PID1"
wait_bounded "$PID1" 10
expect_eq "$RC" 143 "node 1's exit status"
wait_bounded "$PID0" 10
expect_eq "$RC" 143 "node 0's exit status"
expect_eq "$(attempts "$SEEN" | tr '\n' ' ')" "0 " "attempts"
expect_contains "$TMP/term.0.err" \
    "the job failed on node 1 and ends (restarts used: 0 of 3): its launcher received SIGTERM" \
    "node 0's line"

check "bad agreement: node 1 with another --max-restarts, or another secret, is refused"
export SEEN="$TMP/bad" MODE=sleep
mkdir -p "$SEEN"
PORT=$(free_port)
start_node badk 0 -n 1 --max-restarts 2
start_node badk 1 -n 1 --max-restarts 1
wait_bounded "$PID1" 20
expect_eq "$RC" 2 "node 1's exit status"
wait_bounded "$PID0" 20
expect_eq "$RC" 2 "node 0's exit status"
expect_contains "$TMP/badk.1.err" "this node's launcher has -n 1 --max-restarts 1, but node 0's" \
    "node 1's message"
expect_contains "$TMP/badk.0.err" "the job failed on node 1 and ends" "node 0's message"
PORT=$(free_port)
DTRAIN_TIMEOUT=1.5 start_node badsecret 0 -n 1 --max-restarts 1
DTRAIN_SECRET=${SECRET}x start_node badsecret 1 -n 1 --max-restarts 1
wait_bounded "$PID1" 20
expect_eq "$RC" 1 "node 1's exit status"
expect_contains "$TMP/badsecret.1.err" "refused this launcher's secret: every node must export" \
    "node 1's message"
wait_bounded "$PID0" 20
expect_eq "$RC" 1 "node 0's exit status"
expect_contains "$TMP/badsecret.0.err" "1 of the 2 nodes came to node 0's store" "node 0's message"
[[ -z "$(ls "$SEEN")" ]] || fail "ranks started: $(ls "$SEEN")"

check "bad values: DTRAIN_TIMEOUT under restarts; DTRAIN_STORE_SERVER other than 'launcher' in" \
    "a rank; an inherited one is not passed on without restarts (rank 0 serves)"
DTRAIN_TIMEOUT=abc bad "DTRAIN_TIMEOUT=abc is not a number" -n 1 --max-restarts 1
rc=0
DTRAIN_STORE_SERVER=rank0 "$FAULTS" stream 1 >/dev/null 2>"$TMP/server.err" || rc=$?
[[ $rc -ne 0 ]] || fail "a rank with DTRAIN_STORE_SERVER=rank0 exited 0"
want="DTRAIN_STORE_SERVER=rank0 is not 'launcher' (the launcher serves the store) or unset"
expect_contains "$TMP/server.err" "$want (rank 0 serves it)" "the rank's message"
out=$(DTRAIN_STORE_SERVER=launcher "$DTRAIN" launch -n 1 -- \
    sh -c 'echo "${DTRAIN_STORE_SERVER-unset}"')
expect_eq "$out" unset "DTRAIN_STORE_SERVER without restarts"

check "a real 2-node job (test_faults stream), rank 0 killed with SIGKILL: the store lives on" \
    "in node 0's launcher, the job restarts on both nodes and ends 0"
export E2E="$TMP/e2e"
mkdir -p "$E2E"
PORT=$(free_port)
for n in 0 1; do
    DTRAIN_TIMEOUT=10 DTRAIN_FAULT_UNTIL="$E2E/stop" \
        "$DTRAIN" launch --nnodes 2 --node-rank $n --master-addr 127.0.0.1 --master-port "$PORT" \
        -n 1 --max-restarts 1 -- bash -c \
        'export DTRAIN_FAULT_PIDDIR="$E2E/a$TORCHELASTIC_RESTART_COUNT"
         mkdir -p "$DTRAIN_FAULT_PIDDIR"; exec "$0" stream 20 5' "$FAULTS" \
        >"$E2E/out$n" 2>"$E2E/err$n" &
    eval "PID$n=$!"
    LAUNCHERS="$LAUNCHERS $!"
done
for _ in $(seq 1 200); do
    grep -q "^rank 1: stream: " "$E2E/out1" && break
    sleep 0.05
done
grep -q "^rank 1: stream: " "$E2E/out1" || { cat "$E2E"/err* >&2; fail "attempt 0 did not stream"; }
# Node 1's launcher is held (SIGSTOP) until rank 1 has said how it
# failed, or the restart would kill it before it could.
kill -STOP "$PID1"
kill -KILL "$(cat "$E2E/a0/rank0.pid")"
for _ in $(seq 1 300); do
    grep -q "^rank 1: error: " "$E2E/err1" && break
    sleep 0.05
done
kill -CONT "$PID1"
# Rank 1 heard of rank 0's death from the store, which rank 0 did not
# take with it.
expect_contains "$E2E/err1" "job aborted: rank 0 was lost" "rank 1's error in attempt 0"
! grep -q "lost the connection to the store" "$E2E/err1" || fail "rank 1 lost the store"
for _ in $(seq 1 200); do
    grep -q "restart 1 of 1" "$E2E/err0" && grep -q "restart 1 of 1" "$E2E/err1" && break
    sleep 0.05
done
: >"$E2E/stop"
wait_bounded "$PID0" 30
expect_eq "$RC" 0 "node 0's exit status"
wait_bounded "$PID1" 30
expect_eq "$RC" 0 "node 1's exit status"
expect_contains "$E2E/out0" "rank 0: stream: finished " "attempt 1, rank 0"
expect_contains "$E2E/out1" "rank 1: stream: finished " "attempt 1, rank 1"

grep -h "^dtrain launch: " "$TMP"/restart.*.err "$E2E"/err* | sed "s/^/  /"
echo "ok"
