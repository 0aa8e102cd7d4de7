#!/usr/bin/env bash
# dt_comm_init from the environment of each launcher docs/comm.md names, without
# the launcher itself: ranks started by hand with only Open MPI's, MPICH/PMI's
# or Slurm's variables (and no MASTER_ADDR/MASTER_PORT or DTRAIN_SECRET, as
# under those launchers) must find each other and pass the collective test.
#
# Usage: bootstrap_env.sh path/to/test_collectives
set -euo pipefail
PROG=${1:?usage: $0 path/to/test_collectives}
NP=3
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

run_job() { # name, then a function that prints rank r's variables
    local name=$1 vars=$2 r rc=0 out
    out=$(mktemp)
    pids=()
    for ((r = 0; r < NP; r++)); do
        # env -i: nothing from the calling shell (no torchrun variables) leaks in.
        env -i PATH="$PATH" DTRAIN_TIMEOUT=60 $($vars $r) "$PROG" --quick --large 1000 \
            >>"$out" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    if [[ $rc -ne 0 ]] || ! grep -q "$NP ranks over shm: .* 0 failed" "$out"; then
        echo "FAIL: $name bootstrap (exit $rc):"
        cat "$out"
        exit 1
    fi
    echo "ok: $name: $(grep 'ranks over' "$out")"
    rm -f "$out"
}

# A job id of our own per run, so that concurrent runs pick different ports.
id=$$$RANDOM
ompi() { echo OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=$NP OMPI_COMM_WORLD_LOCAL_RANK=$1 \
    OMPI_COMM_WORLD_LOCAL_SIZE=$NP OMPI_MCA_ess_base_jobid=$id; }
pmi() { echo PMI_RANK=$1 PMI_SIZE=$NP MPI_LOCALRANKID=$1 MPI_LOCALNRANKS=$NP PMI_JOBID=$id; }
slurm() { echo SLURM_PROCID=$1 SLURM_NTASKS=$NP SLURM_LOCALID=$1 SLURM_NTASKS_PER_NODE=$NP \
    SLURM_JOB_ID=$id SLURM_STEP_NODELIST=localhost; }

run_job "Open MPI" ompi
run_job "MPICH/PMI" pmi
run_job "Slurm" slurm
