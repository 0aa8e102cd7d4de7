#!/usr/bin/env bash
# `dtrain sample` shows what a model learned: trained on one sentence
# repeated, the greedy continuation (top-k 1) of its start must be the
# sentence. Sampling is deterministic for a seed.
#   test_sample.sh DTRAIN
set -euo pipefail
dtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sentence="the quick brown fox jumps over the lazy dog. "
for _ in $(seq 400); do printf '%s' "$sentence"; done > "$tmp/data.txt"

"$dtrain" train --data "$tmp/data.txt" --n-layer 2 --n-head 2 --n-embd 64 --block-size 64 \
  --batch-size 8 --steps 150 --lr 3e-3 --threads 1 --eval-batches 0 --out "$tmp/run" >/dev/null

got=$("$dtrain" sample --ckpt "$tmp/run" --prompt "the quick" --tokens 60 --top-k 1)
want="the quick brown fox jumps over the lazy dog. the quick brown fox jump"
[ "$got" = "$want" ] || { echo "FAIL: greedy continuation"; echo " got: $got"; echo "want: $want"; exit 1; }

a=$("$dtrain" sample --ckpt "$tmp/run/ckpt-00000150" --prompt "the" --tokens 40 --temperature 2 --seed 3)
b=$("$dtrain" sample --ckpt "$tmp/run/ckpt-00000150/model.safetensors" --prompt "the" --tokens 40 \
    --temperature 2 --seed 3)
c=$("$dtrain" sample --ckpt "$tmp/run" --prompt "the" --tokens 40 --temperature 2 --seed 4)
[ "$a" = "$b" ] || { echo "FAIL: same seed, different text"; exit 1; }
[ "$a" != "$c" ] || { echo "FAIL: another seed gave the same text at temperature 2"; exit 1; }
[ ${#a} -eq 43 ] || { echo "FAIL: expected 3 + 40 characters, got ${#a}: $a"; exit 1; }
echo "ok: greedy continuation is the training sentence; sampling deterministic per seed"
