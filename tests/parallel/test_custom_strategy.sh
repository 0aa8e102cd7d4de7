#!/usr/bin/env bash
# Strategies registered from outside the library train through the
# library's trainer unchanged: 2 ranks of test_custom_strategy (reduce to
# rank 0, then broadcast; alone, and stacked under a layer that runs the
# micro-batches) end with weights bit-identical to DDP's; a stack of two
# layers that both run the micro-batches is refused; the names are refused
# where they are not registered.
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

# Two layers on one stack: reduce_bcast's gradients, the micro-batches run
# by an auditing layer that checks every hook's order; still DDP's weights.
"$dtrain" launch -n 2 "$custom" "${common[@]}" --grad-accum 2 --strategy reduce_bcast_audit \
  --save-final "$tmp/audit.safetensors" > "$tmp/audit.out" 2>&1 \
  || { echo "FAIL: the composed strategy did not train"; cat "$tmp/audit.out"; exit 1; }
grep -q "audit: 6 steps, 12 backward passes (6 last), 6 ends, 0 out of order" "$tmp/audit.out" \
  || { echo "FAIL: the hooks did not come in order"; cat "$tmp/audit.out"; exit 1; }
"$dtrain" train --nproc 2 "${common[@]}" --grad-accum 2 --save-final "$tmp/ddp2.safetensors" \
  > "$tmp/ddp2.out" 2>&1 || { echo "FAIL: DDP did not train"; cat "$tmp/ddp2.out"; exit 1; }
cmp "$tmp/audit.safetensors" "$tmp/ddp2.safetensors" \
  || { echo "FAIL: the composed strategy's weights differ from DDP's"; exit 1; }
# Two layers that both run the micro-batches are refused when built.
if "$custom" "${common[@]}" --strategy dp_with_audit > "$tmp/err" 2>&1; then
  echo "FAIL: naive DP and a second micro-batch runner were combined"; exit 1
fi
grep -q "strategies dp and audit cannot be combined: both run the micro-batches" "$tmp/err" \
  || { echo "FAIL: unexpected message"; cat "$tmp/err"; exit 1; }

if "$dtrain" train "${common[@]}" --strategy reduce_bcast > "$tmp/err" 2>&1; then
  echo "FAIL: dtrain train accepted a strategy it does not have"; exit 1
fi
grep -q "'reduce_bcast' is not a strategy (choices: ddp|dp|ps)" "$tmp/err" \
  || { echo "FAIL: unexpected message"; cat "$tmp/err"; exit 1; }
echo "ok: registered strategies train through the unchanged trainer, alone and stacked, bit-identical to DDP; a conflicting stack is refused"
