#!/usr/bin/env bash
# MPI asked for where it cannot be had: ranks started by `dtrain launch`,
# not by mpirun, with an `mpi` algorithm forced or DTRAIN_TRANSPORT=mpi.
# dt_comm_init must fail on every rank with a message that says why, and
# the launcher must exit non-zero, promptly: never a hang, never a run that
# quietly ignores the request. Holds with and without MPI built in.
#
# Usage: mpi_without_mpirun.sh path/to/dtrain path/to/test_collectives
set -euo pipefail
DTRAIN=${1:?usage: $0 path/to/dtrain path/to/test_collectives}
PROG=${2:?usage: $0 path/to/dtrain path/to/test_collectives}
LIMIT_S=30 # dt_comm_init fails in well under a second; a hang meets this

# Nothing of an mpirun around us, nor a transport or algorithm of the caller's.
unset DTRAIN_TRANSPORT DTRAIN_SECRET DTRAIN_JOB_ID MASTER_ADDR MASTER_PORT
vars=$(env | sed -n 's/^\(OMPI_[A-Za-z0-9_]*\|PMIX_[A-Za-z0-9_]*\|DTRAIN_[A-Z_]*_ALGO\)=.*/\1/p')
for v in $vars; do
    unset "$v"
done

out=$(mktemp)
trap 'rm -f "$out"' EXIT

expect_refusal() { # name, expected message (ERE), then VAR=VALUE...
    local name=$1 want=$2 rc=0 start end
    shift 2
    start=$(date +%s)
    env "$@" DTRAIN_TIMEOUT=20 timeout -k 5 "$LIMIT_S" "$DTRAIN" launch -n 2 "$PROG" --quick \
        >"$out" 2>&1 || rc=$?
    end=$(date +%s)
    if [[ $rc -eq 0 ]]; then
        echo "FAIL: $name: the job succeeded; expected dt_comm_init to refuse"
        cat "$out"
        exit 1
    fi
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        echo "FAIL: $name: still running after $LIMIT_S s (a hang)"
        cat "$out"
        exit 1
    fi
    local n
    n=$(grep -cE "dt_comm_init: .*($want)" "$out" || true)
    if [[ $n -lt 1 ]]; then
        echo "FAIL: $name: exit $rc, but no rank said '$want':"
        cat "$out"
        exit 1
    fi
    echo "ok: $name: exit $rc after $((end - start)) s: $(grep -m1 -E "$want" "$out")"
}

expect_refusal "DTRAIN_ALLREDUCE_ALGO=mpi" \
    "allreduce algorithm 'mpi' needs ranks started by mpirun" DTRAIN_ALLREDUCE_ALGO=mpi
expect_refusal "DTRAIN_ALLTOALL_ALGO=mpi" \
    "alltoall algorithm 'mpi' needs ranks started by mpirun" DTRAIN_ALLTOALL_ALGO=mpi
# Either refusal, depending on whether this dtrain has MPI built in.
why="( needs ranks started by Open MPI's mpirun|: this dtrain was built without)"
expect_refusal "DTRAIN_TRANSPORT=mpi" "DTRAIN_TRANSPORT=mpi$why" DTRAIN_TRANSPORT=mpi
