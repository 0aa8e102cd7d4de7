#!/usr/bin/env bash
# A rank killed in the middle of a stream of all-reduces: every surviving
# rank must fail with an error naming the dead rank, and the launcher must
# exit non-zero, all within a few seconds, although DTRAIN_TIMEOUT is 30 s:
# the store sees the dead rank's control connection close and tells
# everyone at once, so nobody should have to wait for the deadline. Rank 0
# is a case of its own, since it serves the store: the others must notice
# losing the store itself.
#
# Usage: fault_kill.sh path/to/dtrain path/to/test_faults [shm|tcp]...
# (the transports to run with; both by default)
set -euo pipefail
source "$(dirname "$0")/lib_launch.sh"
fault_args "$@"

NP=4
TIMEOUT_S=30
LIMIT_MS=15000 # half the deadline: reaching it means someone waited for a timeout

kill_case() { # name transport victim
    local name=$1 transport=$2 victim=$3 r t0 ms
    check "$transport, $NP ranks: SIGKILL rank $victim mid-stream -> every other rank names" \
        "rank $victim, launcher non-zero, all within $((LIMIT_MS / 1000)) s"
    start_stream_job "$name" "$transport"
    local launcher=$JOB_PID
    local pid
    pid=$(rank_pid "$name" "$victim")
    t0=$(now_ms)
    kill -KILL "$pid"
    wait_job "$launcher" 60
    ms=$(($(now_ms) - t0))
    note "launcher exited with status $JOB_RC, $ms ms after the kill"
    [[ $JOB_RC -ne 0 ]] || fail "the launcher exited 0 although rank $victim was killed"
    ((ms < LIMIT_MS)) || fail "the job took $ms ms to end after the kill (limit $LIMIT_MS ms)"
    # Not asserted: which rank the launcher blames. Survivors exit within
    # milliseconds of the kill, and when several ranks are gone by the time
    # the launcher looks, it may name a survivor's status 3 first.
    note "$(grep -E '^dtrain launch: ' "$TMP/$name.err" | head -1)"
    for ((r = 0; r < NP; r++)); do
        [[ $r -eq $victim ]] && continue
        # "rank 2" followed by anything but a digit, so rank 2 is not
        # confused with rank 20; a survivor's own "rank R of N" never matches.
        expect_error_line "$name" $r "rank $victim([^0-9]|$)" "the killed rank $victim"
    done
    expect_no_bug_lines "$name"
    expect_no_sanitizer_reports "$name"
    expect_no_leftovers "$name"
}

for transport in "${TRANSPORTS[@]}"; do
    kill_case "kill_${transport}_2" "$transport" 2
    kill_case "kill_${transport}_0" "$transport" 0
done

echo "ok"
