#!/usr/bin/env bash
# Resume is exact: 20 steps in one run, and 10 + 10 with a stop and --resume
# between, give bit-identical losses, weights and optimizer state.
#   test_resume.sh DTRAIN [extra train flags...]
set -euo pipefail
dtrain=$1; shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

/usr/bin/python3 - "$tmp/data.txt" <<'PY'
import random, sys
random.seed(3)
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(30000)))
PY

# A constant rate after warmup, so that a 10-step run follows the same
# schedule as the first half of a 20-step one. Shuffling on: the data order
# must survive the restart too.
common=(--data "$tmp/data.txt" --n-layer 2 --n-head 2 --n-embd 32 --block-size 32
        --batch-size 4 --grad-accum 2 --lr 2e-3 --lr-schedule constant --warmup-steps 4
        --weight-decay 0.1 --grad-clip 1 --shuffle 1 --seed 9 --threads 1
        --eval-batches 2 "$@")

"$dtrain" train "${common[@]}" --steps 20 --out "$tmp/a" --log-json "$tmp/a.json" >/dev/null
"$dtrain" train "${common[@]}" --steps 10 --out "$tmp/b" --log-json "$tmp/b.json" >/dev/null
"$dtrain" train "${common[@]}" --steps 20 --out "$tmp/b" --log-json "$tmp/b.json" --resume \
  > "$tmp/b2.out"
grep -q "resumed from $tmp/b/ckpt-00000010 at step 10" "$tmp/b2.out" \
  || { echo "FAIL: no resume message"; cat "$tmp/b2.out"; exit 1; }

losses() { grep '"loss"' "$1" | sed 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*/\1 \2/'; }
if ! diff <(losses "$tmp/a.json") <(losses "$tmp/b.json"); then
  echo "FAIL: losses differ between the straight and the resumed run"; exit 1
fi
[ "$(losses "$tmp/a.json" | wc -l)" -eq 20 ] || { echo "FAIL: expected 20 logged steps"; exit 1; }
for f in model.safetensors optimizer.safetensors; do
  cmp "$tmp/a/ckpt-00000020/$f" "$tmp/b/ckpt-00000020/$f" \
    || { echo "FAIL: $f differs after resume"; exit 1; }
done
echo "ok: 20 steps == 10 + resume 10, bit for bit ($(losses "$tmp/a.json" | tail -1))"

# --keep-last: of checkpoints every 2 steps over 10, the last 2 remain.
"$dtrain" train "${common[@]}" --steps 10 --save-every 2 --keep-last 2 --out "$tmp/k" >/dev/null
[ "$(cd "$tmp/k" && echo ckpt-* latest)" = "ckpt-00000008 ckpt-00000010 latest" ] \
  || { echo "FAIL: keep-last left: $(ls -A "$tmp/k")"; exit 1; }
# A fresh run must not mix into a run directory; resuming on other data is refused.
if "$dtrain" train "${common[@]}" --steps 12 --out "$tmp/k" >/dev/null 2>"$tmp/err"; then
  echo "FAIL: a fresh run wrote into a directory with checkpoints"; exit 1
fi
grep -q "already holds checkpoints" "$tmp/err" || { cat "$tmp/err"; exit 1; }
head -c 20000 "$tmp/data.txt" > "$tmp/other.txt"
if "$dtrain" train "${common[@]}" --data "$tmp/other.txt" --steps 12 --out "$tmp/k" --resume \
     >/dev/null 2>"$tmp/err"; then
  echo "FAIL: resumed on other data"; exit 1
fi
grep -q "trained on [0-9]* tokens of data" "$tmp/err" || { cat "$tmp/err"; exit 1; }
echo "ok: keep-last, no mixing of runs, no resuming on other data"

# Ctrl-C: the run stops after the current step, saves it, and exits 130.
"$dtrain" train "${common[@]}" --steps 1000000 --out "$tmp/c" --log-json "$tmp/c.json" \
  >/dev/null 2>&1 &
pid=$!
for _ in $(seq 600); do
  [ "$(cat "$tmp/c.json" 2>/dev/null | grep -c '"loss"')" -ge 3 ] && break
  sleep 0.05
done
kill -INT $pid
rc=0; wait $pid || rc=$?
[ $rc -eq 130 ] || { echo "FAIL: interrupted run exited $rc, want 130"; exit 1; }
n=$(grep -c '"loss"' "$tmp/c.json")
[ "$(cat "$tmp/c/latest")" = "$(printf 'ckpt-%08d' "$n")" ] \
  || { echo "FAIL: after $n logged steps latest is $(cat "$tmp/c/latest")"; exit 1; }
echo "ok: SIGINT after $n steps saved $(cat "$tmp/c/latest") and exited 130"
