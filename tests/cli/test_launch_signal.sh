#!/usr/bin/env bash
# Signals to the launcher: SIGTERM / SIGINT stop every rank and everything
# the ranks started, the exit status is 128+signal; a second signal does
# not wait for SIGTERM to work; a SIGKILLed launcher leaves no rank behind.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# Starts a 3-rank job in the background and waits until every rank and its
# child have written their pids.
start_job() {
    rm -f "$TMP"/*.pid
    "$DTRAIN" launch -n 3 "$@" 2>"$TMP/launcher.err" &
    LAUNCHER=$!
    wait_for_pids 6
}

for sig in TERM INT; do
    check "SIGTERM/SIGINT to the launcher: SIG$sig -> exit $((128 + $(kill -l $sig))), no survivors"
    start_job -- bash -c "$RANK_WITH_CHILD"
    t0=$(now_ms)
    kill -s $sig $LAUNCHER
    rc=0
    wait $LAUNCHER || rc=$?
    ms=$(($(now_ms) - t0))
    expect_eq "$rc" $((128 + $(kill -l $sig))) "exit status"
    [[ $ms -lt 2500 ]] || fail "took $ms ms to stop"
    expect_contains "$TMP/launcher.err" "received SIG$sig" "launcher message"
    expect_no_survivors
done

check "a second SIGTERM kills ranks that ignore the first at once"
start_job -- bash -c 'trap "" TERM; '"$RANK_WITH_CHILD"
t0=$(now_ms)
kill -TERM $LAUNCHER
sleep 0.3
kill -TERM $LAUNCHER
rc=0
wait $LAUNCHER || rc=$?
ms=$(($(now_ms) - t0))
expect_eq "$rc" 143 "exit status"
[[ $ms -lt 2000 ]] || fail "took $ms ms, the second signal should not wait 3 s"
expect_no_survivors

check "a launcher killed with SIGKILL leaves no rank running (parent-death signal)"
rm -f "$TMP"/*.pid
"$DTRAIN" launch -n 3 -- bash -c 'echo $$ > "$TMP/rank$RANK.pid"; exec sleep 60' &
LAUNCHER=$!
wait_for_pids 3
kill -KILL $LAUNCHER
wait $LAUNCHER || true
expect_no_survivors

echo "ok"
