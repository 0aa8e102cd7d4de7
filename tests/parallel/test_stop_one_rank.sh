#!/usr/bin/env bash
# A signal to one rank of a multi-rank job stops the whole job cleanly: the
# ranks agree to stop after the same step, rank 0 saves it, and every rank
# exits with the signal's status (SIGTERM: 143), as the docs promise. A
# signal to rank 1 only (a scheduler stopping one task) used to end the
# job in a collective mismatch, because only that rank skipped the final
# evaluation.
#   test_stop_one_rank.sh DTRAIN [extra train flags...]
set -euo pipefail
dtrain=$1; shift
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
pid=

/usr/bin/python3 - "$tmp/data.txt" <<'PY'
import random, sys
random.seed(5)
words = "one two three four five six seven eight nine ten".split()
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(20000)))
PY

"$dtrain" train --nproc 2 --data "$tmp/data.txt" --n-layer 1 --n-head 2 --n-embd 32 \
  --block-size 32 --batch-size 2 --threads 1 --steps 1000000 --eval-batches 2 --print-every 1000 \
  --out "$tmp/run" --log-json "$tmp/log.json" "$@" >"$tmp/out" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [ -f "$tmp/log.json" ] && [ "$(grep -c '"loss"' "$tmp/log.json")" -ge 3 ] && break
  sleep 0.05
done
rank1=
for child in $(pgrep -P "$pid"); do
  tr '\0' '\n' < "/proc/$child/environ" 2>/dev/null | grep -qx 'RANK=1' && rank1=$child
done
[ -n "$rank1" ] || { echo "FAIL: rank 1 not found among the launcher's children"; cat "$tmp/out"; exit 1; }
kill -TERM "$rank1"
rc=0; wait "$pid" || rc=$?
pid=
if [ $rc -ne 143 ]; then
  echo "FAIL: the job exited $rc after SIGTERM to rank 1, want 143"; cat "$tmp/out"; exit 1
fi
if grep -q "disagree\|mismatch" "$tmp/out"; then
  echo "FAIL: the ranks fell out of step"; cat "$tmp/out"; exit 1
fi
n=$(grep -c '"loss"' "$tmp/log.json")
[ "$(cat "$tmp/run/latest")" = "$(printf 'ckpt-%08d' "$n")" ] \
  || { echo "FAIL: after $n logged steps latest is $(cat "$tmp/run/latest")"; cat "$tmp/out"; exit 1; }
grep -q "interrupted at step $n" "$tmp/out" \
  || { echo "FAIL: no 'interrupted at step $n'"; cat "$tmp/out"; exit 1; }
echo "ok: SIGTERM to rank 1 stopped the job after step $n, saved it, exit 143"
