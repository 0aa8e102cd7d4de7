#!/usr/bin/env bash
# A disk that fills while a checkpoint is saved: the save fails with a
# message, and the run directory is left resumable from the checkpoint
# before (or, when there was none, free for a fresh start). The disk is a
# tmpfs of a few megabytes, filled to the page so that the write fails at a
# chosen point; mounting it needs root (the tests run as root in CI):
# without, the test is skipped (ctest reports it so, never as passed).
#   test_disk_full.sh DTRAIN
set -uo pipefail
dtrain=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)

if [ "${2:-}" != --inside ]; then
  if [ "$(id -u)" != 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
    echo "skipped: needs root to mount a small tmpfs in a mount namespace"
    exit 77
  fi
  exec unshare -m --propagation private bash "$0" "$dtrain" --inside
fi

tmp=$(mktemp -d)
fs=$tmp/fs
mkdir -p "$fs"
trap 'umount "$fs" 2>/dev/null; rm -rf "$tmp"' EXIT
mount -t tmpfs -o size=32m tmpfs "$fs" || { echo "FAIL: cannot mount a tmpfs"; exit 1; }
fails=0
. "$here/helpers.sh"

make_text "$tmp/data.txt" 5000 2
common=(--data "$tmp/data.txt" --n-layer 1 --n-head 2 --n-embd 32 --block-size 16
        --batch-size 2 --threads 1 --eval-batches 0 --seed 5 --save-every 2 --keep-last 3
        --lr-schedule constant)

# The reference: 4 steps on a disk with room. (A constant rate: a run of
# 2 steps then follows the schedule of the first 2 of 4.)
"$dtrain" train "${common[@]}" --steps 4 --out "$tmp/ref" >/dev/null || exit 1
# The 4 KiB pages one checkpoint takes on the tmpfs (directories take none).
pages=0
for f in "$tmp/ref/ckpt-00000004"/*; do
  pages=$((pages + ($(stat -c %s "$f") + 4095) / 4096))
done
avail() { df -B4096 --output=avail "$fs" | tail -1 | tr -d ' '; }
# leave N: fill the disk until exactly N pages are free.
leave() {
  rm -f "$fs/filler"
  local n=$(($(avail) - $1))
  [ $n -le 0 ] || dd if=/dev/zero of="$fs/filler" bs=4096 count=$n status=none 2>/dev/null
  [ "$(avail)" -eq "$1" ] || { echo "FAIL: could not leave $1 pages free ($(avail))"; exit 1; }
}
ckpts() { (cd "$1" && ls -A | grep -v '^\.lock$' | tr '\n' ' '); }

# 1. The first save fails at `latest`: nothing is left that would stop a
#    fresh start (before, the run could neither resume nor start again).
#    The run's lock file takes a page: it is made here, before counting.
mkdir -p "$fs/a" && echo "pid 1 on nowhere" > "$fs/a/.lock"
leave "$pages"
expect_error "first save, disk full at latest" \
  "a/latest.*No space left on device.*checkpoint of step 2 is withdrawn" \
  "$dtrain" train "${common[@]}" --steps 2 --out "$fs/a"
[ -z "$(ckpts "$fs/a")" ] || { echo "FAIL: the failed save left: $(ckpts "$fs/a")"; fails=$((fails + 1)); }
rm -f "$fs/filler"
expect_ok "a fresh start after it" "$dtrain" train "${common[@]}" --steps 2 --out "$fs/a"

# 2. A later save fails at `latest`: the run resumes from the checkpoint
#    before, and ends where the reference did.
"$dtrain" train "${common[@]}" --steps 2 --out "$fs/b" >/dev/null || exit 1
leave "$pages"
expect_error "second save, disk full at latest" \
  "b/latest.*No space left on device.*checkpoint of step 4 is withdrawn" \
  "$dtrain" train "${common[@]}" --steps 4 --out "$fs/b" --resume
[ "$(ckpts "$fs/b")" = "ckpt-00000002 latest " ] && [ "$(cat "$fs/b/latest")" = ckpt-00000002 ] \
  || { echo "FAIL: after the failed save: $(ckpts "$fs/b"), latest $(cat "$fs/b/latest")"; fails=$((fails + 1)); }

# 3. The disk fills while the tensors are written: the same.
leave $((pages / 2))
expect_error "second save, disk full in the tensors" "safetensors.*No space left on device" \
  "$dtrain" train "${common[@]}" --steps 4 --out "$fs/b" --resume
[ "$(ckpts "$fs/b")" = "ckpt-00000002 latest " ] \
  || { echo "FAIL: after the failed save: $(ckpts "$fs/b")"; fails=$((fails + 1)); }

rm -f "$fs/filler"
expect_ok "resuming after the failures" "$dtrain" train "${common[@]}" --steps 4 --out "$fs/b" --resume
grep -q "resumed from $fs/b/ckpt-00000002 at step 2" "$tmp/out" \
  || { echo "FAIL: did not resume from step 2"; cat "$tmp/out"; fails=$((fails + 1)); }
for f in model.safetensors optimizer.safetensors; do
  cmp -s "$tmp/ref/ckpt-00000004/$f" "$fs/b/ckpt-00000004/$f" \
    || { echo "FAIL: $f of step 4 differs from the reference"; fails=$((fails + 1)); }
done

[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "ok: a full disk fails the save and leaves the run resumable ($pages pages per checkpoint)"
