#!/usr/bin/env bash
# Two hosts for real, on one machine: two network namespaces, each with its
# own hostname and its own /dev/shm (lib_netns.sh).
#
# One `dtrain launch -n 2 --nnodes 2` per host runs the collective test
# matrix with DTRAIN_TRANSPORT unset: the two ranks of a host must talk over
# shared memory and the hosts over TCP ("over shm+tcp"), and both launchers
# must exit 0.
#
# Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN); without it the test says
# SKIP and exits 77.
#
# Usage: netns_two_hosts.sh path/to/dtrain path/to/test_collectives [ARGS...]
# (ARGS go to test_collectives; --quick by default)
set -euo pipefail
DTRAIN=${1:?usage: $0 path/to/dtrain path/to/test_collectives [ARGS...]}
COLL=${2:?usage: $0 path/to/dtrain path/to/test_collectives [ARGS...]}
shift 2
COLL_ARGS=("$@")
[[ ${#COLL_ARGS[@]} -gt 0 ]] || COLL_ARGS=(--quick)
source "$(dirname "$0")/lib_launch.sh"

source "$(dirname "$0")/lib_netns.sh"
netns_two_hosts_up

check "2 hosts x 2 ranks, DTRAIN_TRANSPORT unset: test_collectives ${COLL_ARGS[*]} passes on" \
    "both, over shm+tcp"
# A fresh namespace has every port free.
PORT=29500
export DTRAIN_SECRET
DTRAIN_SECRET=$(random_hex 16)
# Each host: its own hostname and a private /dev/shm, then the launcher,
# exec'd so that the job's pid is the launcher's. The launcher's default
# job id (the same on both hosts, from the secret, address and port) is
# kept: that is what real hosts do.
JOB_ID_FROM_LAUNCHER=1 # read by start_job
HOST_LAUNCHERS=()
for node in 0 1; do
    if [[ $node -eq 0 ]]; then ns=$NS_A host=hostA; else ns=$NS_B host=hostB; fi
    LAUNCH_WRAP=(ip netns exec "$ns" unshare --uts --mount --propagation private
        sh -c "$HOST_SETUP" "$host")
    start_job "host$node" DTRAIN_TIMEOUT=60 -- -n 2 --nnodes 2 --node-rank $node \
        --master-addr $ADDR_A --master-port $PORT -- "$COLL" "${COLL_ARGS[@]}"
    HOST_LAUNCHERS[node]=$JOB_PID
done
unset LAUNCH_WRAP
wait_job "${HOST_LAUNCHERS[0]}" 240
RC_0=$JOB_RC
wait_job "${HOST_LAUNCHERS[1]}" 60
RC_1=$JOB_RC
note "host 0's launcher exited with status $RC_0, host 1's with $RC_1"
[[ $RC_0 -eq 0 && $RC_1 -eq 0 ]] || fail "a launcher failed"
expect_no_sanitizer_reports host0
expect_no_sanitizer_reports host1
line=$(grep -E "^test_collectives: " "$TMP/host0.out" || true)
note "$line"
[[ -n "$line" ]] || fail "rank 0 printed no result line"
grep -qE "^test_collectives: 4 ranks over shm\+tcp: [0-9]+ checks, 0 failed" <<<"$line" ||
    fail "expected 4 ranks over shm+tcp with 0 failures"
# The cross-host traffic really took the veth pair: the matrix moves tens
# of MiB between the hosts; the store alone would be a few KiB.
for dir in rx tx; do
    bytes=$(ip netns exec "$NS_A" cat "/sys/class/net/$VETH_A/statistics/${dir}_bytes")
    note "host 0's veth: $bytes bytes ${dir}"
    ((bytes > 4 * 1024 * 1024)) || fail "only $bytes bytes ${dir} on host 0's veth"
done
for ns in "$NS_A" "$NS_B"; do
    [[ -z "$(ip netns pids "$ns")" ]] || fail "processes left in $ns: $(ip netns pids "$ns" | tr '\n' ' ')"
done

echo "ok"
