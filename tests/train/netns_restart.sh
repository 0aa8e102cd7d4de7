#!/usr/bin/env bash
# Restarts on two real hosts (two network namespaces, each with its own
# hostname and /dev/shm: tests/comm/lib_netns.sh), one `dtrain launch
# --nnodes 2 --max-restarts 2` per host, one rank each, training the tiny
# preset over TCP with snapshots every step:
#
#   host 1 lost     its rank killed and its shared memory emptied (the
#                   host's memory gone): the job restarts on both hosts and
#                   continues from the snapshot in memory, host 1's shard
#                   coming from its partner copy on host 0
#   host 0 lost     the same for rank 0's host, whose launcher serves the
#                   store: the store outlives rank 0
#
# Both end with the final weights of the same job undisturbed, bit for bit,
# and both launchers exit 0. Needs root (SKIP, exit 77, without it).
#
# Usage: netns_restart.sh path/to/dtrain
set -euo pipefail
DTRAIN=${1:?usage: $0 path/to/dtrain}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../comm/lib_launch.sh"
source "$HERE/../comm/lib_netns.sh"
netns_two_hosts_up

export DTRAIN_SECRET
DTRAIN_SECRET=$(random_hex 16)
PORT=29500 # a fresh namespace has every port free
TRAIN=(train --model tiny --steps 24 --batch-size 4 --seq-len 64 --eval-batches 0
    --threads 1 --print-every 1000)
JOB_ID_FROM_LAUNCHER=1 # the same on both hosts, as on real ones
declare -A HOST_PID

# run_hosts NAME: both hosts' launchers, in the background.
run_hosts() {
    local name=$1 node ns host
    for node in 0 1; do
        if [[ $node -eq 0 ]]; then ns=$NS_A host=hostA; else ns=$NS_B host=hostB; fi
        LAUNCH_WRAP=(ip netns exec "$ns" unshare --uts --mount --propagation private
            sh -c "$HOST_SETUP" "$host")
        start_job "$name$node" DTRAIN_TIMEOUT=60 DTRAIN_TEST_SLOW=forward:60:1 -- \
            -n 1 --nnodes 2 --node-rank $node \
            --master-addr $ADDR_A --master-port $PORT --max-restarts 2 -- \
            "$DTRAIN" "${TRAIN[@]}" --log-json "$TMP/$name.json" --save-final "$TMP/$name.st"
        HOST_PID[$node]=$JOB_PID
    done
    unset LAUNCH_WRAP
}

# wait_hosts NAME: both launchers must exit 0.
wait_hosts() {
    local name=$1
    wait_job "${HOST_PID[0]}" 240
    local rc0=$JOB_RC
    wait_job "${HOST_PID[1]}" 60
    note "$name: host 0's launcher exited with status $rc0, host 1's with $JOB_RC"
    if [[ $rc0 -ne 0 || $JOB_RC -ne 0 ]]; then
        tail -20 "$TMP/${name}0.out" "$TMP/${name}0.err" "$TMP/${name}1.out" "$TMP/${name}1.err"
        fail "$name: a launcher failed"
    fi
}

logged() { # the steps a --log-json file holds so far (0 before it exists)
    local n
    n=$(grep -c '"loss"' "$1" 2>/dev/null) || true
    echo "${n:-0}"
}

# lose NAME NODE: once 4 steps are logged, the host's rank is stopped, its
# snapshots emptied (in its mount namespace), and the rank killed: a host
# lost at once. (Emptied first, a live rank could meet the empty directory
# and exit on its own, and the kill then hit its replacement.) Rank 1
# sleeps 60 ms in every step's forward (DTRAIN_TEST_SLOW), so the 20 steps
# after the 4th take over a second: on a loaded machine the tiny model's
# steps once all ran between two looks of this loop, and the job ended
# before the kill.
lose() {
    local name=$1 node=$2 pid=${HOST_PID[$2]} i
    for i in $(seq 1 600); do
        (($(logged "$TMP/$name.json") >= 4)) && break
        alive "$pid" || fail "$name: host $node's launcher ended before 4 steps"
        sleep 0.05
    done
    pkill -STOP -P "$pid"
    nsenter -t "$pid" -m -- sh -c 'rm -rf /dev/shm/dtrain-snap-*'
    pkill -KILL -P "$pid"
    note "$name: host $node's memory emptied and its rank killed at logged step $(logged "$TMP/$name.json")"
}

check "the job undisturbed on two hosts"
run_hosts ref
wait_hosts ref

for node in 1 0; do
    check "host $node lost: the job continues from the snapshot in memory on both hosts, bit" \
        "for bit"
    run_hosts lost$node
    lose lost$node $node
    wait_hosts lost$node
    said=$(grep -h "^restart 1:" "$TMP/lost${node}0.out" || true)
    note "$said"
    grep -q "from the snapshot in memory" <<<"$said" || fail "not continued from the snapshot"
    grep -q "copied between hosts" <<<"$said" || fail "nothing said copied between hosts"
    /usr/bin/python3 "$HERE/st_same.py" "$TMP/ref.st" "$TMP/lost$node.st" ||
        fail "the final weights differ from the undisturbed run's"
done
echo "ok"
