#!/usr/bin/env bash
# A small /dev/shm (containers get 64 MiB by default) must never crash a
# rank with SIGBUS: the library reserves its rings when it makes them,
# sizes them to the space there is, and when even the smallest rings do
# not fit, dt_comm_init fails with a message that names /dev/shm and the
# bytes needed.
#
# Each case runs in a mount namespace of its own whose /dev/shm is a tmpfs
# of the given size:
#  - 4 MiB, 4 ranks: the default rings want 6 MiB per rank; the collective
#    test must pass, over shared memory;
#  - 4 MiB, `dtrain train --nproc 2` (the case that was found crashing with
#    exit 135 in its first all-reduce): it must train to the end;
#  - 8 KiB, 2 ranks: not even the smallest rings fit; every rank must fail
#    at dt_comm_init, naming /dev/shm and the bytes, and no rank may die of
#    a signal.
#
# Needs root (a mount namespace); without it the test says SKIP and exits 77.
# Usage: shm_full.sh path/to/dtrain path/to/test_collectives
set -euo pipefail
DTRAIN=${1:?usage: $0 path/to/dtrain path/to/test_collectives}
COLL=${2:?usage: $0 path/to/dtrain path/to/test_collectives}
source "$(dirname "$0")/lib_launch.sh"

[[ $(id -u) == 0 ]] || { echo "SKIP: needs root for a mount namespace"; exit 77; }
command -v unshare >/dev/null || { echo "SKIP: no 'unshare' command"; exit 77; }
unshare -m --propagation private true 2>/dev/null || { echo "SKIP: unshare -m refused"; exit 77; }

# in_small_shm SIZE CMD...: CMD with /dev/shm a fresh tmpfs of SIZE.
in_small_shm() {
    local size=$1
    shift
    unshare -m --propagation private sh -c \
        'mount -t tmpfs -o size="$0" tmpfs /dev/shm && exec "$@"' "$size" "$@"
}

export DTRAIN_TIMEOUT=60

check "4 ranks, collectives, in a 4 MiB /dev/shm"
rc=0
in_small_shm 4m "$DTRAIN" launch -n 4 "$COLL" --quick --large 300000 >"$TMP/coll.out" 2>&1 || rc=$?
[[ $rc == 0 ]] || { cat "$TMP/coll.out"; fail "test_collectives exited $rc"; }
grep -q "over shm:" "$TMP/coll.out" || { cat "$TMP/coll.out"; fail "the ranks did not use shared memory"; }
note "passed over shared memory"

check "dtrain train --nproc 2 in a 4 MiB /dev/shm"
rc=0
in_small_shm 4m "$DTRAIN" train --nproc 2 --steps 20 --threads 1 --batch-size 2 --seq-len 32 \
    >"$TMP/train.out" 2>&1 || rc=$?
[[ $rc == 0 ]] || { tail -20 "$TMP/train.out"; fail "dtrain train exited $rc"; }
grep -q "step 20/20" "$TMP/train.out" || { tail -20 "$TMP/train.out"; fail "training did not reach step 20"; }
note "trained 20 steps"

check "2 ranks in an 8 KiB /dev/shm: a clear error at dt_comm_init"
rc=0
in_small_shm 8k "$DTRAIN" launch -n 2 "$COLL" --quick >"$TMP/tiny.out" 2>&1 || rc=$?
cat "$TMP/tiny.out"
[[ $rc != 0 ]] || fail "the job succeeded, though its rings cannot fit"
[[ $rc -lt 128 ]] || fail "the job ended with exit $rc (a signal), not an error"
grep "dt_comm_init" "$TMP/tiny.out" | grep "/dev/shm" | grep -q "bytes" ||
    fail "no dt_comm_init error naming /dev/shm and the bytes needed"
if grep -q "killed by signal" "$TMP/tiny.out"; then fail "a rank died of a signal"; fi
note "failed at setup with exit $rc"
echo "PASS"
