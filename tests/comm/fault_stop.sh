#!/usr/bin/env bash
# A rank stopped (SIGSTOP) in the middle of a stream of all-reduces: it
# holds its connections open, so only deadlines can catch it. With
# DTRAIN_TIMEOUT=3 the others must time out, and every one of them must
# name the stopped rank, although in a ring most of them wait on a
# neighbour that is itself only waiting (the store's heartbeat check is
# what points at the real culprit). The launcher must exit non-zero and
# must not leave the stopped rank behind: SIGTERM cannot reach a stopped
# process, so this checks its escalation to SIGKILL.
#
# Rank 0 stopped is weaker by nature: it serves the store, so there is no
# heartbeat check to name it, and each rank can only report the peer it
# was waiting for. There every rank must still fail within the deadline
# and nothing may be left behind, and the ranks that wait on rank 0
# directly must name it.
#
# Usage: fault_stop.sh path/to/dtrain path/to/test_faults [TRANSPORT:RANK]...
# (the cases to run; shm:2 tcp:2 shm:0 by default)
set -euo pipefail
DTRAIN=${1:?usage: $0 path/to/dtrain path/to/test_faults [TRANSPORT:RANK]...}
FAULTS=${2:?usage: $0 path/to/dtrain path/to/test_faults [TRANSPORT:RANK]...}
shift 2
CASES=("$@")
[[ ${#CASES[@]} -gt 0 ]] || CASES=(shm:2 tcp:2 shm:0)
source "$(dirname "$0")/lib_launch.sh"

NP=4
TIMEOUT_S=3
# Deadline (3 s) + the wait for the store's verdict (2 s) + the launcher's
# grace period (5 s) + its SIGTERM-to-SIGKILL wait (3 s) = 13 s, plus room
# for a loaded machine; far from the 30 s that a hang would need.
LIMIT_MS=25000
# The errors must come from the deadline, not before it. The store counts
# from the last heartbeat, which can precede the stop by one heartbeat
# interval (DTRAIN_TIMEOUT / 4), hence the margin.
MIN_MS=$((TIMEOUT_S * 1000 - 1000))

stop_case() { # name transport victim
    local name=$1 transport=$2 victim=$3 r t0 ms pid
    check "$transport, $NP ranks: SIGSTOP rank $victim mid-stream, DTRAIN_TIMEOUT=$TIMEOUT_S ->" \
        "every other rank fails naming rank $victim, launcher non-zero, no process left"
    start_stream_job "$name" "$transport"
    local launcher=$JOB_PID
    pid=$(rank_pid "$name" "$victim")
    t0=$(now_ms)
    kill -STOP "$pid"
    # The first error line marks when the deadline fired.
    wait_for_lines "$TMP/$name.err" "^rank [0-9]+: error: " 1 20 "$launcher"
    ms=$(($(now_ms) - t0))
    note "first error $ms ms after the stop"
    ((ms >= MIN_MS)) || fail "a rank failed $ms ms after the stop, before the $TIMEOUT_S s deadline"
    wait_job "$launcher" 40
    ms=$(($(now_ms) - t0))
    note "launcher exited with status $JOB_RC, $ms ms after the stop"
    note "$(grep -E '^dtrain launch: ' "$TMP/$name.err" | head -1)"
    [[ $JOB_RC -ne 0 ]] || fail "the launcher exited 0 although rank $victim was stopped"
    ((ms < LIMIT_MS)) || fail "the job took $ms ms to end after the stop (limit $LIMIT_MS ms)"
    for ((r = 0; r < NP; r++)); do
        [[ $r -eq $victim ]] && continue
        if [[ $victim -ne 0 ]]; then
            expect_error_line "$name" $r "rank $victim([^0-9]|$)" "the stopped rank $victim"
        else
            expect_error_line "$name" $r "timed out|rank 0([^0-9]|$)" "a timeout or rank 0"
        fi
    done
    if [[ $victim -eq 0 ]]; then
        # Ranks 1 and 3 exchange with rank 0 directly in every ring step;
        # which of their pending operations each reports is up to timing.
        grep -qE "^rank [13]: error: .*rank 0([^0-9]|$)" "$TMP/$name.err" ||
            fail "no rank names rank 0, not even its ring neighbours"
    fi
    [[ -z "$(error_lines "$name" "$victim")" ]] || fail "the stopped rank printed an error"
    expect_no_bug_lines "$name"
    expect_no_sanitizer_reports "$name"
    # The stopped rank too: the launcher must have killed it.
    expect_no_leftovers "$name"
}

for c in "${CASES[@]}"; do
    stop_case "stop_${c%%:*}_${c##*:}" "${c%%:*}" "${c##*:}"
done

echo "ok"
