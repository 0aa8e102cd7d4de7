# Two hosts on one machine for the scripts that source it (after
# lib_launch.sh): two network namespaces joined by a veth pair
# (198.18.0.1 and 198.18.0.2, the benchmarking range). Each host then gets
# its own hostname (UTS namespace) and its own /dev/shm (mount namespace)
# through HOST_SETUP, run as the launcher's wrapper:
#
#   LAUNCH_WRAP=(ip netns exec "$NS_A" unshare --uts --mount --propagation private
#                sh -c "$HOST_SETUP" hostA)
#
# Without the hostnames the library would see one host (it groups ranks by
# hostname and boot id, and the boot id is the kernel's) and use shared
# memory between the "hosts"; without the private /dev/shm both hosts would
# share shared-memory names, which real hosts never do.
#
# netns_two_hosts_up needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN); without
# it, the script says SKIP and exits 77. The namespaces go with the script's
# cleanup.

HOST_SETUP='mount -t tmpfs -o size=512m dtrain-shm /dev/shm && hostname "$0" && exec "$@"'

skip() {
    echo "SKIP: $*"
    exit 77
}

for tool in ip unshare mount; do
    command -v $tool >/dev/null || skip "no '$tool' command"
done

# A random suffix keeps concurrent runs (two build trees, ctest -j) apart.
SUFFIX=$(random_hex 3)
NS_A="dtrainA$SUFFIX"
NS_B="dtrainB$SUFFIX"
VETH_A="dtva$SUFFIX" # at most 15 characters
VETH_B="dtvb$SUFFIX"
ADDR_A=198.18.0.1
ADDR_B=198.18.0.2

netns_cleanup() {
    local ns pid
    for ns in "$NS_A" "$NS_B"; do
        ip netns list 2>/dev/null | grep -qw "$ns" || continue
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
        # Deleting a namespace also deletes its end of the veth pair, and
        # with it the other end.
        ip netns del "$ns" 2>/dev/null
    done
}
CLEANUP_HOOKS+=(netns_cleanup)

netns_two_hosts_up() {
    check "two network namespaces joined by a veth pair"
    ip netns add "$NS_A" 2>"$TMP/ip.err" || skip "cannot create a network namespace: $(cat "$TMP/ip.err")"
    ip netns add "$NS_B" 2>"$TMP/ip.err" || skip "cannot create a network namespace: $(cat "$TMP/ip.err")"
    ip link add "$VETH_A" netns "$NS_A" type veth peer name "$VETH_B" netns "$NS_B" 2>"$TMP/ip.err" ||
        skip "cannot create a veth pair: $(cat "$TMP/ip.err")"
    ip -n "$NS_A" addr add $ADDR_A/24 dev "$VETH_A"
    ip -n "$NS_B" addr add $ADDR_B/24 dev "$VETH_B"
    for ns in "$NS_A" "$NS_B"; do
        ip -n "$ns" link set lo up
    done
    ip -n "$NS_A" link set "$VETH_A" up
    ip -n "$NS_B" link set "$VETH_B" up
    # The UTS and mount namespaces need CAP_SYS_ADMIN as well; try once, so a
    # refusal is a SKIP rather than two failed launches.
    ip netns exec "$NS_A" unshare --uts --mount --propagation private \
        sh -c 'hostname probe && mount -t tmpfs none /dev/shm' 2>"$TMP/ip.err" ||
        skip "cannot create UTS and mount namespaces: $(cat "$TMP/ip.err")"
    # A veth link takes a moment to come up; wait until A reaches B.
    if command -v ping >/dev/null; then
        for i in $(seq 1 50); do
            ip netns exec "$NS_A" ping -c 1 -W 1 $ADDR_B >/dev/null 2>&1 && break
            [[ $i -lt 50 ]] || fail "$ADDR_A cannot reach $ADDR_B over the veth pair"
            sleep 0.1
        done
    fi
}
