#!/usr/bin/env bash
# Runs a rank as if on host RANK / DTRAIN_TEST_PER_HOST of a job spread over
# several hosts, on one machine: the host's name (DTRAIN_HOSTNAME, so the
# library groups the ranks by it and joins the "hosts" over TCP) and the
# host's own shared memory (a directory DTRAIN_TEST_SHM_ROOT/HOST mounted
# on /dev/shm in a mount namespace of the rank's own). The directory stays
# between attempts, as a host's memory does while it lives; emptying it is
# losing the host's memory.
#
# Usage (needs CAP_SYS_ADMIN): dtrain launch -n N -- host_wrap.sh PROGRAM [ARGS...]
set -euo pipefail
host=$((RANK / ${DTRAIN_TEST_PER_HOST:-1}))
export DTRAIN_HOSTNAME="host$host"
shm="${DTRAIN_TEST_SHM_ROOT:?set it to a directory for the shared memory of the hosts}/$host"
mkdir -p "$shm"
exec unshare --mount --propagation private \
    sh -c 'mount --bind "$0" /dev/shm && exec "$@"' "$shm" "$@"
