#!/usr/bin/env bash
# Every file a run will write is checked before its first step: a bad
# --save-final or --out fails at once (status 1, a message naming the path),
# not after the training it would have saved; good ones still work.
#   test_outputs.sh DTRAIN
set -uo pipefail
dtrain=$1
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; umount "$tmp/ro" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0

. "$(dirname "$0")/helpers.sh"

# expect_refused NAME PATTERN ARGS...: training fails (expect_error) and
# ran no step first.
expect_refused() {
  local name=$1 pattern=$2 before=$fails; shift 2
  expect_error "$name" "$pattern" "$dtrain" train "${t[@]}" "$@"
  if [ $fails -eq $before ] && grep -q "^step " "$tmp/out"; then
    echo "FAIL $name: it trained before failing"; fails=$((fails + 1))
  fi
}

head -c 20000 /dev/urandom | base64 > "$tmp/data.txt"
t=(--data "$tmp/data.txt" --steps 3 --threads 1 --eval-batches 0 --n-layer 1 --n-embd 16
   --n-head 2 --block-size 16 --batch-size 2)
touch "$tmp/a_file"
mkdir "$tmp/a_dir"
expect_refused "--save-final in a missing directory" \
  "--save-final $tmp/nodir/w.safetensors: the directory $tmp/nodir does not exist" \
  --save-final "$tmp/nodir/w.safetensors"
expect_refused "--save-final naming a directory" "--save-final $tmp/a_dir: is a directory" \
  --save-final "$tmp/a_dir"
expect_refused "--out under a file" "--out $tmp/a_file/run: $tmp/a_file is not a directory" \
  --out "$tmp/a_file/run"
expect_refused "--out that is a file" "--out $tmp/a_file: $tmp/a_file is not a directory" \
  --out "$tmp/a_file"
# A read-only filesystem refuses even root, whom permission bits do not stop.
mkdir "$tmp/ro"
if mount -t tmpfs -o size=1m,ro tmpfs "$tmp/ro" 2>/dev/null; then
  expect_refused "--out on a read-only filesystem" "--out $tmp/ro/run: cannot create files in $tmp/ro" \
    --out "$tmp/ro/run"
  expect_refused "--save-final on a read-only filesystem" \
    "--save-final $tmp/ro/w.safetensors: cannot create files in $tmp/ro" --save-final "$tmp/ro/w.safetensors"
  umount "$tmp/ro"
else
  echo "FAIL: cannot mount a read-only tmpfs (the tests run as root)"; fails=$((fails + 1))
fi
# The same refusal stops every rank of a job.
expect_refused "--save-final in a missing directory, 2 ranks" "the directory $tmp/nodir does not exist" \
  --nproc 2 --save-final "$tmp/nodir/w.safetensors"

# Good outputs: a directory still to be made, and a new file.
if ! "$dtrain" train "${t[@]}" --out "$tmp/new/deeper/run" --save-final "$tmp/w.safetensors" \
     >"$tmp/out" 2>"$tmp/err"; then
  echo "FAIL good outputs refused:"; cat "$tmp/err"; fails=$((fails + 1))
elif [ ! -f "$tmp/w.safetensors" ] || [ ! -f "$tmp/new/deeper/run/latest" ]; then
  echo "FAIL good outputs: files missing"; fails=$((fails + 1))
else
  echo "ok   good outputs written"
fi
[ -z "$(find "$tmp" -name '.dtrain-probe*')" ] || { echo "FAIL: a probe file was left"; fails=$((fails + 1)); }
[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all output checks passed"
