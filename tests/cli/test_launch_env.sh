#!/usr/bin/env bash
# The environment each rank sees: the torchrun variables, the job secret
# and id, and no rank variables of other launchers.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

getv() { sed -n "s/^$1=//p" "$2"; }

# Runs the launcher with the given flags; each rank dumps its environment
# to $TMP/<dir>/env.<RANK>.
dump_env() {
    local dir=$1
    shift
    mkdir -p "$TMP/$dir"
    DUMP_DIR="$TMP/$dir" "$DTRAIN" launch "$@" -- bash -c 'env > "$DUMP_DIR/env.$RANK"'
}

check "single node, 4 ranks: RANK 0..3 unique, torchrun variables, shared secret and job id"
OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_SIZE=9 OMPI_COMM_WORLD_LOCAL_RANK=1 PMI_RANK=3 \
    PMI_SIZE=9 SLURM_PROCID=2 SLURM_NTASKS=9 SLURM_LOCALID=1 dump_env one -n 4
expect_eq "$(ls "$TMP/one" | sort | tr '\n' ' ')" "env.0 env.1 env.2 env.3 " "rank files"
port=$(getv MASTER_PORT "$TMP/one/env.0")
secret=$(getv DTRAIN_SECRET "$TMP/one/env.0")
job=$(getv DTRAIN_JOB_ID "$TMP/one/env.0")
[[ "$port" =~ ^[0-9]+$ && "$port" -ge 1 && "$port" -le 65535 ]] || fail "MASTER_PORT '$port'"
[[ "$secret" =~ ^[0-9a-f]{32}$ ]] || fail "DTRAIN_SECRET '$secret' is not 32 hex chars"
[[ "$job" =~ ^[0-9a-f]{16}$ ]] || fail "DTRAIN_JOB_ID '$job' is not 16 hex chars"
for r in 0 1 2 3; do
    f="$TMP/one/env.$r"
    expect_eq "$(getv RANK "$f")" "$r" "RANK of rank $r"
    expect_eq "$(getv LOCAL_RANK "$f")" "$r" "LOCAL_RANK of rank $r"
    expect_eq "$(getv WORLD_SIZE "$f")" 4 "WORLD_SIZE"
    expect_eq "$(getv LOCAL_WORLD_SIZE "$f")" 4 "LOCAL_WORLD_SIZE"
    expect_eq "$(getv GROUP_RANK "$f")" 0 "GROUP_RANK"
    expect_eq "$(getv NODE_RANK "$f")" 0 "NODE_RANK"
    expect_eq "$(getv MASTER_ADDR "$f")" 127.0.0.1 "MASTER_ADDR"
    expect_eq "$(getv MASTER_PORT "$f")" "$port" "MASTER_PORT same on all ranks"
    expect_eq "$(getv DTRAIN_SECRET "$f")" "$secret" "DTRAIN_SECRET same on all ranks"
    expect_eq "$(getv DTRAIN_JOB_ID "$f")" "$job" "DTRAIN_JOB_ID same on all ranks"
    if grep -E '^(OMPI_COMM_WORLD_[A-Z_]*|PMI_RANK|PMI_SIZE|SLURM_PROCID|SLURM_NTASKS|SLURM_LOCALID)=' "$f"; then
        fail "rank $r still sees another launcher's rank variables"
    fi
done

check "a second launch gets a different secret and job id"
dump_env two -n 1
[[ "$(getv DTRAIN_SECRET "$TMP/two/env.0")" != "$secret" ]] || fail "secret repeated"
[[ "$(getv DTRAIN_JOB_ID "$TMP/two/env.0")" != "$job" ]] || fail "job id repeated"

check "DTRAIN_SECRET and DTRAIN_JOB_ID from the environment are kept"
DTRAIN_SECRET=my-shared-secret DTRAIN_JOB_ID=job42 dump_env keep -n 2
expect_eq "$(getv DTRAIN_SECRET "$TMP/keep/env.1")" my-shared-secret "DTRAIN_SECRET"
expect_eq "$(getv DTRAIN_JOB_ID "$TMP/keep/env.1")" job42 "DTRAIN_JOB_ID"

check "--nnodes 2 --node-rank 1 -n 3: RANK 3..5, WORLD_SIZE 6, port 29500"
DTRAIN_SECRET=s3cret dump_env node1 -n 3 --nnodes 2 --node-rank 1 --master-addr 10.0.0.7
expect_eq "$(ls "$TMP/node1" | sort | tr '\n' ' ')" "env.3 env.4 env.5 " "rank files"
for r in 3 4 5; do
    f="$TMP/node1/env.$r"
    expect_eq "$(getv LOCAL_RANK "$f")" $((r - 3)) "LOCAL_RANK of rank $r"
    expect_eq "$(getv WORLD_SIZE "$f")" 6 "WORLD_SIZE"
    expect_eq "$(getv LOCAL_WORLD_SIZE "$f")" 3 "LOCAL_WORLD_SIZE"
    expect_eq "$(getv GROUP_RANK "$f")" 1 "GROUP_RANK"
    expect_eq "$(getv NODE_RANK "$f")" 1 "NODE_RANK"
    expect_eq "$(getv MASTER_ADDR "$f")" 10.0.0.7 "MASTER_ADDR"
    expect_eq "$(getv MASTER_PORT "$f")" 29500 "MASTER_PORT"
    expect_eq "$(getv DTRAIN_SECRET "$f")" s3cret "DTRAIN_SECRET"
done

check "node 0 in torchrun spelling derives the same job id as node 1"
DTRAIN_SECRET=s3cret dump_env node0 --nproc_per_node=3 --nnodes=2 --node_rank=0 \
    --master_addr=10.0.0.7 --master_port=29500
expect_eq "$(ls "$TMP/node0" | sort | tr '\n' ' ')" "env.0 env.1 env.2 " "rank files"
job1=$(getv DTRAIN_JOB_ID "$TMP/node1/env.3")
[[ "$job1" =~ ^[0-9a-f]{16}$ ]] || fail "derived DTRAIN_JOB_ID '$job1'"
expect_eq "$(getv DTRAIN_JOB_ID "$TMP/node0/env.0")" "$job1" "job id on node 0 vs node 1"

check "--nnodes 2 without DTRAIN_SECRET is refused with advice"
rc=0
"$DTRAIN" launch -n 1 --nnodes 2 --master-addr 10.0.0.7 -- true 2>"$TMP/nosecret.err" || rc=$?
expect_eq "$rc" 2 "exit status"
expect_contains "$TMP/nosecret.err" "export DTRAIN_SECRET=" "advice"

check "--standalone -n 2"
dump_env standalone --standalone -n 2
expect_eq "$(getv WORLD_SIZE "$TMP/standalone/env.1")" 2 "WORLD_SIZE"
expect_eq "$(getv MASTER_ADDR "$TMP/standalone/env.1")" 127.0.0.1 "MASTER_ADDR"

check "all ranks succeed -> exit 0; without --tag-output output is passed through untouched"
out=$("$DTRAIN" launch -n 2 -- echo hello)
expect_eq "$out" $'hello\nhello' "output"

echo "ok"
