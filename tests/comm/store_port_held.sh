#!/usr/bin/env bash
# The port `dtrain launch` picks for a one-host job's store is held from
# the launch on, not merely seen free: until rank 0 serves the store there,
# the kernel hands it to no other socket (another job's link, an outgoing
# connection), while rank 0's store, which binds with SO_REUSEADDR as
# PyTorch's does, can still have it. A port that was only seen free went,
# under `ctest -j2`, to a link of another job, and this job's rank 1 then
# knocked on that job's door.
#
# Run in a network namespace of its own whose ephemeral range is 16 ports,
# so that a process can take every port the kernel would hand out. Needs
# root (or CAP_SYS_ADMIN and CAP_NET_ADMIN) and a writable /proc/sys;
# without them, SKIP (exit 77).
#
# Usage: store_port_held.sh path/to/dtrain path/to/test_faults
set -euo pipefail
DTRAIN=${1:?usage: $0 path/to/dtrain path/to/test_faults}
FAULTS=${2:?usage: $0 path/to/dtrain path/to/test_faults}
FIRST=40000 LAST=40015

skip() {
    echo "SKIP: $*"
    exit 77
}
for tool in unshare ip sysctl python3; do
    command -v $tool >/dev/null || skip "no '$tool' command"
done
# The range is changed only in the namespace this script made, never the
# host's: the third argument, which only the re-run below passes, names the
# namespace it left, and the one it runs in must be another, with no link
# but its loopback.
if [[ ${3:-} != --left-netns=* ]]; then
    unshare -n true 2>/dev/null || skip "cannot make a network namespace (unshare -n needs root)"
    exec unshare -n bash "$0" "$DTRAIN" "$FAULTS" "--left-netns=$(readlink /proc/self/ns/net)"
fi
source "$(dirname "$0")/lib_launch.sh"
left=${3#--left-netns=}
[[ -n "$left" && "$(readlink /proc/self/ns/net)" != "$left" && $(ip -o link | wc -l) -eq 1 ]] ||
    fail "not in a network namespace of its own: the ephemeral range is left alone"
ip link set lo up || skip "cannot bring up the namespace's loopback"
sysctl -qw net.ipv4.ip_local_port_range="$FIRST $LAST" 2>/dev/null ||
    skip "cannot set the namespace's ephemeral range (read-only /proc/sys?)"

# Rank 0 takes every port the kernel will still hand out, then lets them
# go and starts its program 1 s late: rank 1 meanwhile finds nothing
# listening, and retries.
PROBE='
import socket, sys
port, first, last = map(int, sys.argv[1:])
held = []  # each socket stays open, so that the kernel hands out another port
while len(held) <= last - first:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", 0))
    except OSError:
        break
    held.append(s)
taken = [s.getsockname()[1] for s in held]
if not first <= port <= last:
    sys.exit("MASTER_PORT %d is outside the ephemeral range %d-%d" % (port, first, last))
if port in taken:
    sys.exit("the kernel handed the store port %d to another socket" % port)
# (Rank 1 may hold one more port of the range a moment, for a retried connection.)
if len(taken) < last - first - 1:
    sys.exit("the kernel ran out after %d of the %d ports" % (len(taken), last - first + 1))
print("the kernel handed out %d other ports of the range, never the store port %d"
      % (len(taken), port))
'
RANK_SCRIPT='
if [[ $RANK == 0 ]]; then
    python3 -c "$PROBE" "$MASTER_PORT" '"$FIRST $LAST"' || exit 9
    sleep 1
fi
"$FAULTS" join'

check "the store's port is held from the launch on, and rank 0 serves there from behind a shell"
rc=0
PROBE=$PROBE FAULTS=$FAULTS DTRAIN_TIMEOUT=20 timeout 40 \
    "$DTRAIN" launch -n 2 -- bash -c "$RANK_SCRIPT" >"$TMP/held.out" 2>"$TMP/held.err" || rc=$?
[[ $rc -eq 0 ]] || fail "the job failed (status $rc): $(cat "$TMP/held.out" "$TMP/held.err")"
[[ $(grep -c "join: joined a job of 2 ranks" "$TMP/held.out") -eq 2 ]] ||
    fail "not both ranks joined: $(cat "$TMP/held.out")"
note "$(grep "^the kernel" "$TMP/held.out")"
echo "ok"
