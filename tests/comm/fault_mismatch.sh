#!/usr/bin/env bash
# Ranks that disagree about a collective: a count one larger on rank 1, a
# dtype of the same size (so only the message header can tell), a
# broadcast root, a different collective altogether, or the count of one
# pair of an all-to-all-v (rank 1 sends rank 0 one more element than rank
# 0 expects, or none at all), where the error names both ranks and both
# counts. Every rank must fail the call with an error that says what they
# disagree on (never return a result; for a root mismatch, the call or the
# next one: the ranks that think they are the root only send; for the
# all-to-all-v, ranks outside the pair may get their right blocks and fail
# the next call), and the job must end at once, without waiting for
# DTRAIN_TIMEOUT. Each mode runs with a small count and with one large
# enough for the transports' bulk paths (cross-memory attach, streaming).
#
# Usage: fault_mismatch.sh path/to/dtrain path/to/test_faults [shm|tcp|MODE]...
# (transports default to both; modes to all six)
set -euo pipefail
DTRAIN=${1:?usage: $0 path/to/dtrain path/to/test_faults [shm|tcp|MODE]...}
FAULTS=${2:?usage: $0 path/to/dtrain path/to/test_faults [shm|tcp|MODE]...}
shift 2
TRANSPORTS=()
MODES=()
for a in "$@"; do
    case $a in
    shm | tcp) TRANSPORTS+=("$a") ;;
    mismatch | dtype-mismatch | root-mismatch | coll-mismatch | alltoallv-mismatch | \
        alltoallv-zero-mismatch) MODES+=("$a") ;;
    *) echo "unknown transport or mode '$a'" >&2; exit 2 ;;
    esac
done
[[ ${#TRANSPORTS[@]} -gt 0 ]] || TRANSPORTS=(shm tcp)
[[ ${#MODES[@]} -gt 0 ]] || MODES=(mismatch dtype-mismatch root-mismatch coll-mismatch
    alltoallv-mismatch alltoallv-zero-mismatch)
source "$(dirname "$0")/lib_launch.sh"

NP=3
TIMEOUT_S=30
LIMIT_MS=10000 # a third of the deadline: reaching it means someone waited for a timeout

# What each rank's error must name, per mode and count.
what_for() {
    case $1 in
    mismatch) echo "count" ;;
    dtype-mismatch) echo "dtype" ;;
    root-mismatch) echo "root|broadcast" ;;
    coll-mismatch) echo "allgather.*allreduce|allreduce.*allgather" ;;
    alltoallv-mismatch) echo "rank 1 sends $(($2 + 1)) elements to rank 0, which expects $2 from it" ;;
    alltoallv-zero-mismatch) echo "rank 1 sends 0 elements to rank 0, which expects $2 from it" ;;
    esac
}

mismatch_case() { # transport mode count
    local transport=$1 mode=$2 count=$3 name r ms re
    name="${mode//-/_}_${transport}_$count"
    re=$(what_for "$mode" "$count")
    check "$transport, $NP ranks, $mode, count $count: every rank fails naming '$re'," \
        "launcher non-zero, within $((LIMIT_MS / 1000)) s"
    start_job "$name" DTRAIN_TIMEOUT=$TIMEOUT_S DTRAIN_TRANSPORT="$transport" -- \
        -n $NP -- "$FAULTS" "$mode" "$count"
    wait_job "$JOB_PID" 60
    ms=$(($(now_ms) - JOB_T0))
    note "launcher exited with status $JOB_RC after $ms ms"
    expect_no_bug_lines "$name"
    [[ $JOB_RC -ne 0 ]] || fail "the launcher exited 0 although the ranks disagree"
    ((ms < LIMIT_MS)) || fail "the job took $ms ms (limit $LIMIT_MS ms)"
    for ((r = 0; r < NP; r++)); do
        expect_error_line "$name" $r "$re" "the disagreement ($re)"
    done
    expect_no_sanitizer_reports "$name"
    expect_no_leftovers "$name"
}

for transport in "${TRANSPORTS[@]}"; do
    for mode in "${MODES[@]}"; do
        # 1 MiB + 4 bytes of f32: past the shared-memory rings and the
        # cross-memory-attach threshold.
        for count in 1024 262145; do
            mismatch_case "$transport" "$mode" "$count"
        done
    done
done

echo "ok"
