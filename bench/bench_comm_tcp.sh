#!/usr/bin/env bash
# All-reduce over TCP between two hosts, against PyTorch's gloo, in one
# run: two network namespaces joined by a veth pair (198.18.0.1 and .2),
# one rank in each. dtrain's figures come from `dtrain bench comm`, gloo's
# from torch.distributed.all_reduce timed the same way (warm-up, then the
# average of many calls, the slower rank's). Prints the link's limit
# (iperf3 streaming both ways at once between the namespaces; installed if
# missing), then per size both busbw figures, the ratio and each as a
# share of the link. Needs root (namespaces) and python3-torch.
#
# Usage: bench/bench_comm_tcp.sh [path/to/dtrain] [MAX_BYTES]   (default 64M)
set -euo pipefail
DTRAIN=${1:-build/dtrain}
MAX=${2:-64M}
PY=/usr/bin/python3
DTRAIN=$(readlink -f "$DTRAIN")
[[ $(id -u) -eq 0 ]] || { echo "bench_comm_tcp: needs root for network namespaces" >&2; exit 2; }
# The machine and its limits first, as every benchmark prints them.
(cd "$(dirname "$0")" && /usr/bin/python3 -c "import sys, bench_common as b; b.print_machine(sys.argv[1])" "$DTRAIN")
SUF=$RANDOM
NA=dtbA$SUF NB=dtbB$SUF VA=dtba$SUF VB=dtbb$SUF
cleanup() { ip netns del $NA 2>/dev/null || true; ip netns del $NB 2>/dev/null || true; }
trap cleanup EXIT
ip netns add $NA && ip netns add $NB
ip link add $VA netns $NA type veth peer name $VB netns $NB
ip -n $NA addr add 198.18.0.1/24 dev $VA && ip -n $NB addr add 198.18.0.2/24 dev $VB
for ns in $NA $NB; do ip -n $ns link set lo up; done
ip -n $NA link set $VA up && ip -n $NB link set $VB up
sleep 0.5
TMP=$(mktemp -d)
# The link's limit: iperf3 streaming both ways at once between the same
# namespaces (--bidir: a connection each way, one thread), what a 2-rank
# all-reduce's busbw could reach if it did nothing but move bytes; the
# slower direction's received rate.
if ! command -v iperf3 >/dev/null; then
    # its package asks whether to start a daemon: no question, no daemon
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y iperf3 >/dev/null 2>&1 ||
        { apt-get update >/dev/null 2>&1 && apt-get install -y iperf3 >/dev/null 2>&1; } || true
fi
LIMIT=
if command -v iperf3 >/dev/null; then
    # the server serves one test; the timeout ends it if the client never
    # comes (an iperf3 before 3.7 has no --bidir and refuses it)
    timeout 20 ip netns exec $NA iperf3 -s -1 -B 198.18.0.1 -p 29513 >/dev/null 2>&1 &
    SERVER=$!
    sleep 0.5
    ip netns exec $NB iperf3 -c 198.18.0.1 -p 29513 --bidir -t 3 -J >"$TMP/link.json" \
        2>/dev/null || true
    kill $SERVER 2>/dev/null || true
    wait $SERVER 2>/dev/null || true
    LIMIT=$("$PY" -c "
import json, sys
try:
    e = json.load(open(sys.argv[1]))['end']
    print('%.2f' % (min(e['sum_received']['bits_per_second'],
                        e['sum_received_bidir_reverse']['bits_per_second']) / 8e9))
except Exception:
    pass" "$TMP/link.json")
fi

# dtrain: one rank per "host" (own hostname and /dev/shm, as real hosts).
export DTRAIN_SECRET=bench$SUF
HOST='mount -t tmpfs none /dev/shm && hostname "$0" && exec "$@"'
for node in 0 1; do
    ns=$([[ $node == 0 ]] && echo $NA || echo $NB)
    ip netns exec $ns unshare --uts --mount --propagation private sh -c "$HOST" host$node \
        "$DTRAIN" launch -n 1 --nnodes 2 --node-rank $node --master-addr 198.18.0.1 \
        --master-port 29511 -- "$DTRAIN" bench comm --op allreduce --min-bytes 1K \
        --max-bytes "$MAX" --step-factor 8 >"$TMP/dtrain$node.out" 2>&1 &
    sleep 0.2
done
wait
grep -E "^ +[0-9]" "$TMP/dtrain0.out" | awk '{print $1, $8}' >"$TMP/dtrain.txt"

# gloo, timed like `dtrain bench comm` (busbw = algbw for 2 ranks).
cat >"$TMP/gloo.py" <<'PYEOF'
import os, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
rank, maxb = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method="tcp://198.18.0.1:29512", rank=rank, world_size=2)
b = 1024
while b <= maxb:
    x = torch.ones(b // 4)
    iters = 1000 if b <= 65536 else 100 if b <= 4 << 20 else 20
    for _ in range(5): dist.all_reduce(x)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters): dist.all_reduce(x)
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0: print(b, b / t.item() / 1e9, flush=True)
    b *= 8
PYEOF
maxb=$("$PY" -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(float(s[:-1])*m[s[-1]]) if s[-1] in m else int(s))" "$MAX")
for node in 0 1; do
    ns=$([[ $node == 0 ]] && echo $NA || echo $NB)
    dev=$([[ $node == 0 ]] && echo $VA || echo $VB)
    GLOO_SOCKET_IFNAME=$dev OMP_NUM_THREADS=1 timeout 300 ip netns exec $ns "$PY" "$TMP/gloo.py" \
        $node $maxb >"$TMP/gloo$node.out" 2>&1 &
done
wait
[[ -s "$TMP/gloo0.out" ]] || { echo "gloo failed:" >&2; tail -3 "$TMP"/gloo*.out >&2; }
echo "# all-reduce f32 sum, 2 ranks on two network-namespace hosts (veth), busbw in GB/s"
if [[ -n $LIMIT ]]; then
    echo "# the link's limit: $LIMIT GB/s each way, iperf3 --bidir between the namespaces;" \
        "link%: busbw over it"
else
    echo "# the link's limit: not measured (iperf3 missing or failed)"
fi
printf "%12s %10s %10s %8s %12s\n" bytes gloo dtrain ratio "link% g, d"
join <(sort -k1,1 "$TMP/gloo0.out") <(sort -k1,1 "$TMP/dtrain.txt") | sort -n |
    awk -v lim="${LIMIT:-0}" '{printf "%12d %10.2f %10.2f %7.2fx", $1, $2, $3, $3 / $2;
        if (lim > 0) printf " %6.0f, %3.0f", 100 * $2 / lim, 100 * $3 / lim; printf "\n"}'
rm -rf "$TMP"
