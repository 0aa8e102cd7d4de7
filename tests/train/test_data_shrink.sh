#!/usr/bin/env bash
# The --data file truncated under a running job: the run stops with a
# message naming the file and both sizes and exits 1, never killed by a
# signal (before: SIGBUS, exit 135, no message).
#   test_data_shrink.sh DTRAIN
set -uo pipefail
dtrain=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/helpers.sh"
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT

make_text "$tmp/data.txt" 100000 4
size=$(stat -c %s "$tmp/data.txt")

"$dtrain" train --data "$tmp/data.txt" --n-layer 1 --n-head 2 --n-embd 16 --block-size 32 \
  --batch-size 2 --threads 1 --eval-batches 0 --steps 1000000 --log-json "$tmp/log.json" \
  >/dev/null 2>"$tmp/err" &
pid=$!
logged() { cat "$tmp/log.json" 2>/dev/null | grep -c '"loss"'; }
for _ in $(seq 600); do
  [ "$(logged)" -ge 2 ] && break
  sleep 0.05
done
[ "$(logged)" -ge 2 ] || { echo "FAIL: the run did not start"; cat "$tmp/err"; exit 1; }
truncate -s 1000 "$tmp/data.txt"
# It must stop by itself within a minute.
timeout 60 tail --pid="$pid" -f /dev/null || kill "$pid" 2>/dev/null
rc=0
wait "$pid" || rc=$?
pid=
[ $rc -eq 1 ] || { echo "FAIL: exit status $rc, want 1 (135 is SIGBUS)"; cat "$tmp/err"; exit 1; }
grep -Eq "data.txt shrank from $size to 1000 bytes while training" "$tmp/err" \
  || { echo "FAIL: no message naming the file and its sizes:"; cat "$tmp/err"; exit 1; }
echo "ok: $(grep shrank "$tmp/err")"
