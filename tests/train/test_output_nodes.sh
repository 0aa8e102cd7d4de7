#!/usr/bin/env bash
# Output paths that name a device node or a symbolic link: every writer
# that publishes a file by renaming a temporary one over it (--save-final,
# train's and simulate's --trace, `ckpt consolidate --out`, `bench comm
# --calibrate`) leaves a character device a device (same major and minor;
# `--save-final /dev/null` once made the machine's /dev/null a regular
# file) and a link a link, the file it leads to holding the new output.
# The nodes are made with mknod in a temporary directory: the tests run as
# root, and a mknod that is not permitted fails the test.
#   test_output_nodes.sh DTRAIN
set -uo pipefail
dtrain=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
. "$here/helpers.sh"
export DTRAIN_TIMEOUT=60

n=$tmp/n     # the nodes and links the writers are given
f=$tmp/files # the files the links lead to
mkdir "$n" "$f"
make_text "$tmp/data.txt" 5000 1
t=(--data "$tmp/data.txt" --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 2
   --threads 1 --eval-batches 0 --seed 5 --steps 2)
sim=(simulate --ddp --model tiny --vocab-size 64 --ranks 2)

# node NAME [MINOR]: a fresh character device 1,MINOR (/dev/null's 3 by
# default) at n/NAME.
node() {
  rm -f "$n/$1"
  mknod -m 666 "$n/$1" c 1 "${2:-3}" ||
    { echo "FAIL: mknod $n/$1 is not permitted (the tests run as root)"; exit 1; }
}
# link NAME: n/NAME -> ../files/NAME (relative), a file holding "old".
link() { echo old >"$f/$1"; ln -sfn "../files/$1" "$n/$1"; }

# check_node NAME [MINOR]: still the character device 1,MINOR.
check_node() {
  local got
  got=$(stat -c '%F %t,%T' "$n/$1" 2>&1)
  if [ "$got" = "character special file 1,$(printf %x "${2:-3}")" ]; then
    echo "ok   $1 is still the device 1,${2:-3}"
  else
    echo "FAIL $1 is no longer the device 1,${2:-3}: $got"; fails=$((fails + 1))
  fi
}
# check_link NAME CHECK...: still a link to ../files/NAME, and CHECK (a
# command, given the file) accepts the file it leads to.
check_link() {
  local name=$1; shift
  if [ ! -L "$n/$name" ] || [ "$(readlink "$n/$name")" != "../files/$name" ]; then
    echo "FAIL $name is no longer a link to ../files/$name: $(ls -l "$n/$name")"
    fails=$((fails + 1))
  elif [ ! -f "$f/$name" ] || ! "$@" "$f/$name"; then
    echo "FAIL the file $name leads to does not hold the new output: $(head -c 80 "$f/$name")"
    fails=$((fails + 1))
  else
    echo "ok   $name is still a link; its file holds the new output"
  fi
}
is_trace() { grep -q '"traceEvents"' "$1"; }
is_model() { grep -q '"format":.*"dtrain-comm-model' "$1"; }
same_as() { cmp -s "$1" "$2"; } # same_as REFERENCE FILE

# The reference weights, written to a plain new file.
expect_ok "reference run" "$dtrain" train "${t[@]}" --out "$tmp/run" --save-final "$tmp/ref.st"

# ---- train: --save-final and --trace ----------------------------------------
node sf_node; node tr_node
expect_ok "train --save-final and --trace to device nodes" "$dtrain" train "${t[@]}" \
  --save-final "$n/sf_node" --trace "$n/tr_node"
check_node sf_node; check_node tr_node
link sf_link; link tr_link
expect_ok "train --save-final and --trace to links" "$dtrain" train "${t[@]}" \
  --save-final "$n/sf_link" --trace "$n/tr_link"
check_link sf_link same_as "$tmp/ref.st"
check_link tr_link is_trace
# /dev/full takes nothing: the save fails, naming it, and it stays a device.
node full 7
expect_error "train --save-final to /dev/full" "$n/full: write failed: No space left on device" \
  "$dtrain" train "${t[@]}" --save-final "$n/full"
check_node full 7

# ---- simulate --trace -------------------------------------------------------
node sim_node; link sim_link
expect_ok "simulate --trace to a device node" "$dtrain" "${sim[@]}" --trace "$n/sim_node"
check_node sim_node
expect_ok "simulate --trace to a link" "$dtrain" "${sim[@]}" --trace "$n/sim_link"
check_link sim_link is_trace

# ---- ckpt consolidate --out -------------------------------------------------
node ck_node; link ck_link
expect_ok "consolidate --out to a device node" "$dtrain" ckpt consolidate "$tmp/run" \
  --out "$n/ck_node"
check_node ck_node
expect_ok "consolidate --out to a link" "$dtrain" ckpt consolidate "$tmp/run" --out "$n/ck_link"
check_link ck_link same_as "$tmp/ref.st"
# A dangling link: the file it names is created, the link stays.
ln -s ../files/ck_new "$n/ck_new"
expect_ok "consolidate --out to a dangling link" "$dtrain" ckpt consolidate "$tmp/run" \
  --out "$n/ck_new"
check_link ck_new same_as "$tmp/ref.st"

# ---- bench comm --calibrate -------------------------------------------------
node cal_node; link cal_link
expect_ok "bench comm --calibrate to a device node" "$dtrain" bench comm --nproc 2 \
  --calibrate "$n/cal_node"
check_node cal_node
expect_ok "bench comm --calibrate to a link" "$dtrain" bench comm --nproc 2 \
  --calibrate "$n/cal_link"
check_link cal_link is_model

leftover=$(find "$tmp" -name '*.tmp.*')
[ -z "$leftover" ] || { echo "FAIL temporary files left: $leftover"; fails=$((fails + 1)); }
[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "every writer left the device nodes devices and the links links"
