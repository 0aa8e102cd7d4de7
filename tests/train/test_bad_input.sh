#!/usr/bin/env bash
# Bad input to `dtrain train` and `dtrain sample`: each case must exit
# non-zero with a message that names the problem, and never hang or crash.
#   test_bad_input.sh DTRAIN
set -uo pipefail
dtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

. "$(dirname "$0")/helpers.sh"

/usr/bin/python3 - "$tmp" "$(dirname "$0")/../pylib" <<'PY'
import sys, struct, numpy as np
tmp = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import torch
from dtrain_ref import GPT, shard_write, st_write
open(tmp + "/text.txt", "w").write("hello world, " * 2000)
shard_write(tmp + "/good.bin", np.arange(5000) % 50)
data = open(tmp + "/good.bin", "rb").read()
open(tmp + "/truncated.bin", "wb").write(data[:-100])
hdr = np.frombuffer(data[:1024], dtype=np.int32).copy(); hdr[1] = 7
open(tmp + "/version.bin", "wb").write(hdr.tobytes() + data[1024:])
m = GPT(2, 2, 16, 256, 32)
st = m.hf_state()
st_write(tmp + "/ok.safetensors", st, {"n_head": "2"})
st_write(tmp + "/nohead.safetensors", st)
open(tmp + "/foreign.bin", "wb").write(open(tmp + "/ok.safetensors", "rb").read())
missing = dict(st); del missing["h.1.mlp.c_fc.bias"]
st_write(tmp + "/missing.safetensors", missing, {"n_head": "2"})
wrong = dict(st); wrong["h.0.attn.c_proj.weight"] = torch.zeros(16, 17)
st_write(tmp + "/shape.safetensors", wrong, {"n_head": "2"})
open(tmp + "/short.txt", "w").write("short text")
st_write(tmp + "/v50.safetensors", GPT(1, 2, 16, 50, 32).hf_state(), {"n_head": "2"})
open(tmp + "/garbage.safetensors", "wb").write(struct.pack("<Q", 10**9) + b"{}")
PY

t=(train --steps 1 --threads 1 --eval-batches 0 --n-layer 1 --n-embd 16 --n-head 2 --block-size 32)
expect_error "truncated shard" "truncated.bin: truncated" \
  "$dtrain" "${t[@]}" --data "$tmp/truncated.bin"
expect_error "shard of another version" "version.bin: .*version" \
  "$dtrain" "${t[@]}" --data "$tmp/version.bin"
expect_error "binary file as data" "foreign.bin: neither an llm.c shard .* nor text" \
  "$dtrain" "${t[@]}" --data "$tmp/foreign.bin"
expect_error "missing data file" "nope.bin" \
  "$dtrain" "${t[@]}" --data "$tmp/nope.bin"
expect_error "tokens beyond the vocabulary" "holds token [0-9]+, outside the model's vocabulary of 40" \
  "$dtrain" "${t[@]}" --data "$tmp/good.bin" --vocab-size 40
expect_error "init: missing tensor" "missing.safetensors: tensor h.1.mlp.c_fc.bias is missing" \
  "$dtrain" train --steps 1 --threads 1 --eval-batches 0 --data "$tmp/text.txt" \
  --init "$tmp/missing.safetensors"
expect_error "init: wrong shape" "shape.safetensors: tensor h.0.attn.c_proj.weight has shape \[16, 17\], the model needs \[16, 16\]" \
  "$dtrain" train --steps 1 --threads 1 --eval-batches 0 --data "$tmp/text.txt" \
  --init "$tmp/shape.safetensors"
expect_error "init: sizes that disagree" "ok.safetensors has n_layer 2, but 3 was asked for" \
  "$dtrain" train --steps 1 --threads 1 --data "$tmp/text.txt" --init "$tmp/ok.safetensors" \
  --n-layer 3
expect_error "init: no head count" "nohead.safetensors records no n_head .*give --n-head" \
  "$dtrain" train --steps 1 --threads 1 --data "$tmp/text.txt" --init "$tmp/nohead.safetensors"
expect_error "validation data too short, found before training" "short.txt.* too few" \
  "$dtrain" "${t[@]}" --data "$tmp/text.txt" --val-data "$tmp/short.txt" --eval-batches 2 \
  --steps 1000000
expect_error "sample: empty prompt" "prompt is empty" \
  "$dtrain" sample --ckpt "$tmp/ok.safetensors" --prompt ""
expect_error "init: not safetensors" "garbage.safetensors" \
  "$dtrain" train --steps 1 --threads 1 --data "$tmp/text.txt" --init "$tmp/garbage.safetensors"
expect_error "n_embd not divisible by n_head" "n_embd.*divisible|divisible.*n_head" \
  "$dtrain" train --steps 1 --n-embd 100 --n-head 3 --data "$tmp/text.txt"
expect_error "sequence longer than the block" "seq.len.*block.size|block.size.*seq.len" \
  "$dtrain" train --steps 1 --seq-len 64 --block-size 32 --data "$tmp/text.txt"
expect_error "batch sizes that disagree" "train_batch_size 64 does not equal" \
  "$dtrain" train --steps 1 --batch-size 8 --grad-accum 2 --train-batch-size 64 --data "$tmp/text.txt"
expect_error "seq_len longer than the data" "too few" \
  "$dtrain" train --steps 1 --seq-len 128 --block-size 128 --data "$tmp/short.txt" --eval-batches 0
expect_error "resume with nothing to resume" "no checkpoint to resume from" \
  "$dtrain" "${t[@]}" --data "$tmp/text.txt" --out "$tmp/empty-run" --resume
expect_error "unknown flag" "unknown option '--stepz'" "$dtrain" train --stepz 3
expect_error "sample: no such checkpoint" "nope" "$dtrain" sample --ckpt "$tmp/nope"
expect_error "sample: not byte-level" "vocabulary of 50" \
  "$dtrain" sample --ckpt "$tmp/v50.safetensors"

[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "all bad inputs rejected with a message"
