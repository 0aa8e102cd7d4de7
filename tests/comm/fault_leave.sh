#!/usr/bin/env bash
# A rank that calls dt_comm_destroy and leaves while the others still
# expect it in a collective: they must fail within a second or two, not
# after DTRAIN_TIMEOUT (60 s here), with a message that names the rank and
# says that it called dt_comm_destroy, on every rank. A rank that leaves
# after everyone is done is a clean end: no error, no warning, exit 0.
# So are many ranks leaving at once.
#
# Usage: fault_leave.sh path/to/dtrain path/to/test_faults [shm|tcp]...
set -euo pipefail
source "$(dirname "$0")/lib_launch.sh"
fault_args "$@"

NP=3
TIMEOUT_S=60
LIMIT_S=5 # the departure is known within a second; this allows for a loaded machine

leave_case() { # transport leaver
    local transport=$1 leaver=$2 name="leave_$1_$2" r s
    check "$transport: rank $leaver of $NP calls dt_comm_destroy while the others are in an" \
        "all-reduce; they fail within $LIMIT_S s (DTRAIN_TIMEOUT=$TIMEOUT_S) naming it"
    # The leaver lingers; a short grace period has the launcher end it soon
    # after the others' failure.
    start_job "$name" DTRAIN_TIMEOUT=$TIMEOUT_S DTRAIN_TRANSPORT="$transport" \
        DTRAIN_GRACE_PERIOD=1 DTRAIN_FAULT_UNTIL="$TMP/$name.stop" -- \
        -n $NP -- "$FAULTS" leave "$leaver"
    wait_job "$JOB_PID" $((TIMEOUT_S / 2))
    touch "$TMP/$name.stop"
    note "the launcher exited with status $JOB_RC"
    expect_no_bug_lines "$name"
    [[ $JOB_RC -eq 3 ]] || fail "status $JOB_RC, expected 3 (a rank's error)"
    has_line "$TMP/$name.out" "^rank $leaver: leave: leaving" || fail "rank $leaver did not leave"
    for ((r = 0; r < NP; r++)); do
        [[ $r -eq $leaver ]] && continue
        s=$(sed -n "s/^rank $r: leave: failed after \([0-9.]*\) s$/\1/p" "$TMP/$name.out")
        [[ -n "$s" ]] || fail "rank $r did not report its failed all-reduce"
        awk -v s="$s" -v lim=$LIMIT_S 'BEGIN { exit !(s < lim) }' ||
            fail "rank $r failed after $s s, not within $LIMIT_S s"
        note "rank $r failed after $s s"
        expect_error_line "$name" $r "rank $leaver (left|of the job left).*dt_comm_destroy" \
            "rank $leaver and dt_comm_destroy"
    done
    expect_no_sanitizer_reports "$name"
    expect_no_leftovers "$name"
}

clean_case() { # transport leaver
    local transport=$1 leaver=$2 name="clean_$1_$2"
    check "$transport: rank $leaver leaves first after the last all-reduce: a clean end"
    start_job "$name" DTRAIN_TIMEOUT=$TIMEOUT_S DTRAIN_TRANSPORT="$transport" -- \
        -n $NP -- "$FAULTS" leave-clean "$leaver"
    wait_job "$JOB_PID" $((TIMEOUT_S / 2))
    [[ $JOB_RC -eq 0 ]] || fail "status $JOB_RC, expected 0"
    [[ $(grep -c "leave-clean: done" "$TMP/$name.out" || true) -eq $NP ]] ||
        fail "not every rank finished"
    if grep -qE "error|warn|FAIL" "$TMP/$name.err"; then
        fail "a clean end printed: $(head -3 "$TMP/$name.err")"
    fi
    note "every rank finished, nothing said"
    expect_no_leftovers "$name"
}

# Nine ranks that leave at the same moment (a job's normal end): the store
# tells each of them of the others' goodbyes while they close, and a
# goodbye must never be mistaken for a lost rank. Four times over per
# transport in the plain build, twice in each sanitizer build
# (DTRAIN_TEST_TOGETHER_RUNS: nine ranks there take seconds a job): sixteen
# jobs in all.
RUNS=${DTRAIN_TEST_TOGETHER_RUNS:-4}
together_case() { # transport
    local transport=$1 name i
    check "$transport: 9 ranks leave together, $RUNS times over: every job ends cleanly"
    for i in $(seq 1 "$RUNS"); do
        name="together_${transport}_$i"
        start_job "$name" DTRAIN_TIMEOUT=$TIMEOUT_S DTRAIN_TRANSPORT="$transport" -- \
            -n 9 -- "$FAULTS" join
        wait_job "$JOB_PID" $((TIMEOUT_S / 2))
        [[ $JOB_RC -eq 0 ]] || fail "run $i: status $JOB_RC: $(head -2 "$TMP/$name.err")"
        [[ ! -s "$TMP/$name.err" ]] || fail "run $i printed: $(head -3 "$TMP/$name.err")"
        expect_no_leftovers "$name"
    done
    note "$RUNS clean ends"
}

for transport in "${TRANSPORTS[@]}"; do
    together_case "$transport"
    leave_case "$transport" 1
    leave_case "$transport" 0
    clean_case "$transport" 1
    clean_case "$transport" 0
done
echo "ok"
