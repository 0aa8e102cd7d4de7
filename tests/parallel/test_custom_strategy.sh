#!/usr/bin/env bash
# Strategies registered from outside the library train through the
# library's trainer unchanged: 2 ranks of test_custom_strategy (reduce to
# rank 0, then broadcast; alone, and stacked under a layer that runs the
# micro-batches) end with weights bit-identical to DDP's; a stack of two
# layers that both run the micro-batches is refused; the names are refused
# where they are not registered. What reduce_bcast says each rank holds (its
# kind's places, its layer's mem_plan) is what --dry-run and the run's
# memory table print, by memory/plan.h's bytes a float.
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

# Its memory table: each rank's plan of the whole flat buffer, Psi_q floats
# (every tensor of this model is a multiple of 16 floats, so the buffer
# has no padding: Psi = V C + T C + L (12 C^2 + 13 C) + 2 C), 4, 4 and 8
# bytes each in fp32 with AdamW, measured at exactly that at the start.
# Its dry run: the same place for GPT-2 small in fp32 and bf16 (2, 4, 12
# bytes); the activations are the arena DDP's table prints.
"$dtrain" launch -n 2 "$custom" --dry-run --strategy reduce_bcast --model gpt2 \
  --data "$tmp/data.txt" > "$tmp/dry.out" 2>&1 \
  || { echo "FAIL: the custom strategy's dry run"; cat "$tmp/dry.out"; exit 1; }
"$dtrain" launch -n 2 "$custom" --dry-run --strategy reduce_bcast --model gpt2 --dtype bf16 \
  --data "$tmp/data.txt" > "$tmp/dry16.out" 2>&1 \
  || { echo "FAIL: the custom strategy's bf16 dry run"; cat "$tmp/dry16.out"; exit 1; }
"$dtrain" train --dry-run --nproc 2 --model gpt2 --data "$tmp/data.txt" > "$tmp/dryddp.out" \
  || { echo "FAIL: DDP's dry run"; exit 1; }
/usr/bin/python3 - "$tmp" <<'PY' || exit 1
import re, sys
tmp = sys.argv[1]
def psi(V, T, C, L): return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
def mib(b): return "%.1f" % (b / 1048576.0)
def fail(what, path):
    print("FAIL: " + what); print(open(path).read()); sys.exit(1)

p = psi(256, 32, 32, 2)
want = ("    plan, Psi_q = %d: params %s MiB x1.0000 | grads %s MiB x1.0000 | optim %s MiB "
        "x1.0000 | acts" % (p, mib(4 * p), mib(4 * p), mib(8 * p)))
start = open(tmp + "/custom.out").read().split("memory per rank at the start:")[-1]
start = start.split("\nstep ")[0]
if start.count(want) != 2:
    fail("want each rank's plan at the start, %r" % want, tmp + "/custom.out")

p = psi(50257, 1024, 768, 12)
arena = re.search(r"^  MiB +\S+ +\S+ +\S+ +\S+ +(\S+)", open(tmp + "/dryddp.out").read(), re.M)
acts = float(arena.group(1))
for name, P, G, K in (("dry.out", 4, 4, 8), ("dry16.out", 2, 4, 12)):
    out = open(tmp + "/" + name).read()
    if ("memory per rank: reduce_bcast: every rank holds its whole flat buffer; params %d Psi_q "
        "| grads %d Psi_q | optim %d Psi_q\n" % (P, G, K)) not in out:
        fail("no heading of the kind's place in %s" % name, tmp + "/" + name)
    row = re.search(r"^  each of 2 ranks: Psi_q = (\d+) \| params (\S+) MiB \| grads (\S+) MiB "
                    r"\| optim (\S+) MiB \| acts (\S+) MiB \| state \+ acts (\S+) MiB$", out, re.M)
    if not row:
        fail("no row of the kind's place in %s" % name, tmp + "/" + name)
    got = row.groups()
    if got[:5] != (str(p), mib(P * p), mib(G * p), mib(K * p), "%.1f" % acts) or \
       abs(float(got[5]) - ((P + G + K) * p / 1048576.0 + acts)) > 0.1:
        fail("%s: %s, want Psi_q %d, %d/%d/%d bytes a float, acts %.1f"
             % (name, got, p, P, G, K, acts), tmp + "/" + name)
if open(tmp + "/dry.out").read().count("each of 2 ranks") != 1:
    fail("rank 0 alone prints the dry run", tmp + "/dry.out")
PY

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
# A registered kind without a places hook gets no dry run, and is told why.
if "$dtrain" launch -n 2 "$custom" --dry-run --strategy reduce_bcast_audit --data "$tmp/data.txt" \
  > "$tmp/err" 2>&1; then
  echo "FAIL: a kind without places was planned"; exit 1
fi
grep -q -- "--strategy reduce_bcast_audit says nothing of it: run it with --steps 1" "$tmp/err" \
  || { echo "FAIL: unexpected message"; cat "$tmp/err"; exit 1; }
echo "ok: registered strategies train through the unchanged trainer, alone and stacked," \
  "bit-identical to DDP; a conflicting stack is refused; a kind's own places and plan give" \
  "its dry run and memory table"
