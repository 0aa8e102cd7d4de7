#!/usr/bin/env bash
# A strategy registered from outside the library trains through the
# library's trainer unchanged: 2 ranks of test_custom_strategy (reduce to
# rank 0, then broadcast) end with weights bit-identical to DDP's, and its
# name is refused where it is not registered.
#   test_custom_strategy.sh DTRAIN TEST_CUSTOM_STRATEGY
set -euo pipefail
dtrain=$1 custom=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

/usr/bin/python3 - "$tmp/data.txt" <<'PY'
import random, sys
random.seed(6)
words = "north south east west up down left right".split()
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(20000)))
PY
common=(--data "$tmp/data.txt" --n-layer 2 --n-head 2 --n-embd 32 --block-size 32
        --batch-size 2 --steps 6 --threads 1 --shuffle 0 --grad-clip 1 --lr 3e-3)

"$dtrain" launch -n 2 "$custom" "${common[@]}" --strategy reduce_bcast \
  --save-final "$tmp/custom.safetensors" > "$tmp/custom.out" 2>&1 \
  || { echo "FAIL: the custom strategy did not train"; cat "$tmp/custom.out"; exit 1; }
grep -q "x 2 ranks (reduce to rank 0, then broadcast)" "$tmp/custom.out" \
  || { echo "FAIL: the trainer did not describe the custom strategy"; cat "$tmp/custom.out"; exit 1; }
"$dtrain" train --nproc 2 "${common[@]}" --save-final "$tmp/ddp.safetensors" > "$tmp/ddp.out" 2>&1 \
  || { echo "FAIL: DDP did not train"; cat "$tmp/ddp.out"; exit 1; }
cmp "$tmp/custom.safetensors" "$tmp/ddp.safetensors" \
  || { echo "FAIL: reduce+broadcast weights differ from DDP's"; exit 1; }

if "$dtrain" train "${common[@]}" --strategy reduce_bcast > "$tmp/err" 2>&1; then
  echo "FAIL: dtrain train accepted a strategy it does not have"; exit 1
fi
grep -q "'reduce_bcast' is not a strategy (choices: ddp|dp|ps)" "$tmp/err" \
  || { echo "FAIL: unexpected message"; cat "$tmp/err"; exit 1; }
echo "ok: a registered strategy trains through the unchanged trainer, bit-identical to DDP"
