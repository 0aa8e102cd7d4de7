#!/usr/bin/env bash
# The failure policy: the first failing rank's status is the launcher's,
# the others get the grace period, then SIGTERM, then SIGKILL, and nothing
# of the job is left running.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

check "rank 1 exits 7 while the others sleep: exit 7 right after a 1 s grace period, no survivors"
t0=$(now_ms)
rc=0
"$DTRAIN" launch -n 3 --grace-period 1 -- bash -c \
    'if [[ $RANK == 1 ]]; then echo $$ > "$TMP/rank1.pid"; exit 7; fi; '"$RANK_WITH_CHILD" \
    2>"$TMP/exit7.err" || rc=$?
ms=$(($(now_ms) - t0))
expect_eq "$rc" 7 "exit status"
[[ $ms -ge 900 && $ms -lt 3000 ]] || fail "took $ms ms, expected about 1000"
expect_contains "$TMP/exit7.err" "dtrain launch: rank 1 (pid $(cat "$TMP/rank1.pid")) exited with status 7" \
    "failure line"
expect_no_survivors
rm -f "$TMP"/*.pid

check "the others fail on their own within the grace period: no waiting, first status wins"
t0=$(now_ms)
rc=0
"$DTRAIN" launch -n 3 --grace-period 10 -- bash -c \
    'if [[ $RANK == 0 ]]; then exit 5; fi; sleep 0.3; exit 9' 2>"$TMP/own.err" || rc=$?
ms=$(($(now_ms) - t0))
expect_eq "$rc" 5 "exit status"
[[ $ms -lt 3000 ]] || fail "took $ms ms, should not wait for the grace period"
if grep -q SIGTERM "$TMP/own.err"; then fail "sent SIGTERM though the ranks exited on their own"; fi

check "DTRAIN_GRACE_PERIOD=0.2 is honoured"
t0=$(now_ms)
rc=0
DTRAIN_GRACE_PERIOD=0.2 "$DTRAIN" launch -n 2 -- bash -c \
    'if [[ $RANK == 0 ]]; then exit 3; fi; exec sleep 60' 2>/dev/null || rc=$?
ms=$(($(now_ms) - t0))
expect_eq "$rc" 3 "exit status"
[[ $ms -lt 1500 ]] || fail "took $ms ms with a 0.2 s grace period"

check "a rank killed by SIGKILL: exit 137 and the signal named"
rc=0
"$DTRAIN" launch -n 3 --grace-period 0.5 -- bash -c \
    'if [[ $RANK == 2 ]]; then kill -KILL $$; fi; exec sleep 60' 2>"$TMP/kill.err" || rc=$?
expect_eq "$rc" 137 "exit status"
expect_contains "$TMP/kill.err" "rank 2 (pid" "failure line"
expect_contains "$TMP/kill.err" "was killed by signal 9 (Killed)" "failure line"

check "a peer's exit seen before the kill that caused it: the kill is the first failure"
# Rank 0 exits 1 first; rank 1 sees it go (the fifo's write end closes, as
# a peer's connection would) and is killed by SIGKILL a moment later. The
# launcher waits briefly before it takes an exit as the first failure, so
# the kill is named and its status is the job's, whichever order the
# kernel reported them in.
mkfifo "$TMP/peer.fifo"
rc=0
"$DTRAIN" launch -n 3 --grace-period 0.5 -- bash -c \
    'case $RANK in
       0) exec 3>"$TMP/peer.fifo"; exit 1 ;;
       1) cat "$TMP/peer.fifo" >/dev/null; kill -KILL $$ ;;
     esac; exec sleep 60' 2>"$TMP/peer.err" || rc=$?
expect_eq "$rc" 137 "exit status"
first=$(grep -m1 "dtrain launch: rank" "$TMP/peer.err" || true)
[[ $first == *"rank 1 (pid"*"was killed by signal 9"* ]] || fail "first failure named: '$first'"
expect_no_survivors

check "a rank that ignores SIGTERM gets SIGKILL 3 s later"
t0=$(now_ms)
rc=0
"$DTRAIN" launch -n 2 --grace-period 0 -- bash -c \
    'if [[ $RANK == 0 ]]; then while [[ ! -s "$TMP/stubborn.pid" ]]; do sleep 0.01; done; exit 4; fi
     trap "" TERM; echo $$ > "$TMP/stubborn.pid"; while :; do sleep 0.05; done' 2>"$TMP/stubborn.err" || rc=$?
ms=$(($(now_ms) - t0))
expect_eq "$rc" 4 "exit status"
[[ $ms -ge 2900 && $ms -lt 5000 ]] || fail "took $ms ms, expected about 3000"
expect_contains "$TMP/stubborn.err" "sending SIGKILL" "escalation message"
expect_no_survivors
rm -f "$TMP"/*.pid

check "command not found: exit 127 with a clear message"
rc=0
"$DTRAIN" launch -n 2 -- no-such-command-dtrain-test 2>"$TMP/nocmd.err" || rc=$?
expect_eq "$rc" 127 "exit status"
expect_contains "$TMP/nocmd.err" \
    "dtrain launch: cannot run 'no-such-command-dtrain-test': No such file or directory" "message"

check "the job's /dev/shm files are removed after a failure, another job's are kept"
if [[ -d /dev/shm && -w /dev/shm ]]; then
    id="clitest$$"
    other="/dev/shm/dtrain-${id}x-0"
    : >"$other"
    rc=0
    DTRAIN_JOB_ID=$id "$DTRAIN" launch -n 2 -- bash -c \
        ': > "/dev/shm/dtrain-$DTRAIN_JOB_ID-$RANK"; exit $RANK' 2>/dev/null || rc=$?
    expect_eq "$rc" 1 "exit status"
    left=$(find /dev/shm -maxdepth 1 -name "dtrain-$id-*" | wc -l)
    [[ -e "$other" ]] || fail "removed another job's file $other"
    rm -f "$other"
    expect_eq "$left" 0 "files of the job left in /dev/shm"
else
    echo "  (skipped: no writable /dev/shm)"
fi

echo "ok"
