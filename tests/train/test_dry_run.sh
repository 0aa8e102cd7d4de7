#!/usr/bin/env bash
# `dtrain train --dry-run`: the memory table for a model, ZeRO stage, dtype
# and rank count, without training; the figures are computed here by hand
# from Psi. Bad input gets a clear error; gpt2-xl's plan keeps the peak RSS
# small (nothing of the model is allocated).
#   test_dry_run.sh DTRAIN
set -uo pipefail
dtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

. "$(dirname "$0")/helpers.sh"

make_text "$tmp/text.txt" 3000 1
data=(--data "$tmp/text.txt")

# expect_out NAME NEEDLE... -- CMD...: CMD exits 0 and stdout holds every needle.
expect_out() {
  local name=$1; shift
  local needles=()
  while [ "$1" != "--" ]; do needles+=("$1"); shift; done
  shift
  timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL $name: exit status $rc"; cat "$tmp/err"; fails=$((fails + 1)); return
  fi
  for n in "${needles[@]}"; do
    if ! grep -qF -- "$n" "$tmp/out"; then
      echo "FAIL $name: no '$n' in:"; cat "$tmp/out"; fails=$((fails + 1)); return
    fi
  done
  if grep -q "^step " "$tmp/out"; then
    echo "FAIL $name: it trained"; fails=$((fails + 1)); return
  fi
  echo "ok   $name"
}

# GPT-2 small, Psi = 124,439,808; MiB = bytes / 1048576.
#   4 Psi = 474.7, 4 Psi / 4 = 118.7, 8 Psi / 4 = 237.4, 4 + 12/4 Psi = 830.7
expect_out "gpt2 fp32 stage 2 over 4" "Psi = 124439808 parameters" "fp32" "adamw (K = 8" \
  "ZeRO stage 2" "N = 4 data-parallel ranks" "4 Psi + 12 Psi / N" \
  "474.7              118.7              237.4              830.7" "micro-batch 2 x 1024" \
  "at most 204.3 MiB" -- \
  "$dtrain" train --dry-run --model gpt2 --zero-stage 2 --nproc 4 --batch-size 2 "${data[@]}"
#   16 Psi = 1898.8 (DDP, one rank)
expect_out "gpt2 fp32 stage 0, one rank" "16 Psi  " "N = 1 data-parallel rank," \
  "474.7              474.7              949.4              1898.8" -- \
  "$dtrain" train --dry-run --model gpt2 "${data[@]}"
# The activations follow --recompute (gpt.h's sizes, N = 8 x 1024): full
# keeps res3 a layer, 12 x 4 N C = 288.0 MiB; rebuilds one layer's worth,
# 4 (15 N C + 16 N) = 360.5 MiB; and 4 (11 N C + 3 N + N V) = 1834.6 MiB
# whatever the mode: 2483.1 MiB (none: 6448.6)
expect_out "gpt2, recompute full" "2483.1             4381.9" -- \
  "$dtrain" train --dry-run --model gpt2 --recompute full "${data[@]}"
# bf16 mixed precision (fp32 gradient accumulation, G = 4), K = 12 over 2
# ranks: ZeRO-1 (2 + 4) Psi + 12 Psi / 2:
#   2 Psi = 237.4, 4 Psi = 474.7, 6 Psi = 712.1, total 12 Psi = 1424.1
expect_out "gpt2 bf16 stage 1 over 2" "bf16 mixed precision" "K = 12" "6 Psi + 12 Psi / N" \
  "237.4              474.7              712.1              1424.1" -- \
  "$dtrain" train --dry-run --model gpt2 --dtype bf16 --zero-stage 1 --nproc 2 "${data[@]}"
# ZeRO-3 at 4 ranks, bf16: 18 Psi / 4 = 534.0; 2 Psi / 4 = 59.3, 4 Psi / 4 =
# 118.7, 12 Psi / 4 = 356.0; widened to fp32, the head (the larger):
# (38597376 + 786432 wte and wpe + 1536 ln_f) x 4 bytes = 150.2 MiB
expect_out "gpt2 bf16 stage 3 over 4" "18 Psi / N" \
  "59.3               118.7              356.0              534.0" \
  "gathered parameters (2 layers, or the head's)" \
  "parameters widened to fp32 while in use" -- \
  "$dtrain" train --dry-run --model gpt2 --dtype bf16 --zero-stage 3 --nproc 4 "${data[@]}"
# A JSON config (DeepSpeed's keys) as a run reads it; SGD with momentum in
# fp32, K = 4: stage 2 over 2 ranks, 4 Psi + (4 + 4) Psi / 2 = 8 Psi = 949.4
cat >"$tmp/ds.json" <<'EOF'
{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
 "optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9}}}
EOF
expect_out "JSON config, sgd" "sgd (K = 4" "ZeRO stage 2" "4 Psi + 8 Psi / N" \
  "474.7              237.4              237.4              949.4" -- \
  "$dtrain" train --dry-run --config "$tmp/ds.json" --model gpt2 --nproc 2 "${data[@]}"
# The tiny default takes its vocabulary from the data, as a run does:
# Psi = 256 x 128 + 128 x 128 + 4 (12 x 128^2 + 13 x 128) + 2 x 128 = 842,496
expect_out "tiny, vocabulary from the data" "vocab 256" "Psi = 842496 parameters" -- \
  "$dtrain" train --dry-run "${data[@]}"
# Under the launcher the rank count is the job's; rank 0 alone prints.
expect_out "under dtrain launch" "N = 2 data-parallel ranks" -- \
  "$dtrain" launch -n 2 -- "$dtrain" train --dry-run --model gpt2 --zero-stage 3 "${data[@]}"
if [ "$(grep -c "^memory per rank" "$tmp/out")" != 1 ]; then
  echo "FAIL under dtrain launch: want one table:"; cat "$tmp/out"; fails=$((fails + 1))
fi

# Nothing large is allocated: gpt2-xl's 1.56 G parameters would be 5.8 GiB.
rss_kib=$(/usr/bin/python3 - "$dtrain" "$tmp/text.txt" <<'PY'
import resource, subprocess, sys
subprocess.run([sys.argv[1], "train", "--dry-run", "--model", "gpt2-xl", "--zero-stage", "3",
                "--nproc", "4", "--data", sys.argv[2]], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PY
)
if [ -z "$rss_kib" ] || [ "$rss_kib" -gt 65536 ]; then
  echo "FAIL gpt2-xl peak RSS: ${rss_kib:-?} KiB (want under 64 MiB)"; fails=$((fails + 1))
else
  echo "ok   gpt2-xl dry run peak RSS $rss_kib KiB"
fi

expect_error "stage 4" "zero-stage: 4 must be in \[0, 3\]" \
  "$dtrain" train --dry-run --zero-stage 4 "${data[@]}"
expect_error "no ranks" "--nproc needs a rank count" \
  "$dtrain" train --dry-run --nproc 0 "${data[@]}"
expect_error "--nproc against the launcher's" "--nproc 3, but the launcher started 2 ranks" \
  "$dtrain" launch -n 2 -- "$dtrain" train --dry-run --nproc 3 "${data[@]}"
expect_error "stage with ps" "--strategy ps" \
  "$dtrain" train --dry-run --strategy ps --nproc 3 "${data[@]}"
expect_error "stage with dp" "ZeRO stage 1 shards the state over the ranks of --strategy ddp" \
  "$dtrain" train --dry-run --nproc 1 --zero-stage 1 --strategy dp --devices 2 "${data[@]}"
expect_error "sequence too long" "seq_len = 2048 exceeds block_size = 1024" \
  "$dtrain" train --dry-run --model gpt2 --seq-len 2048 "${data[@]}"
expect_error "sp rows a run refuses" "the 1023 rows of a micro-batch .B x T. do not split over 2" \
  "$dtrain" train --dry-run --model gpt2 --nproc 2 --tp 2 --sequence-parallel --batch-size 1 \
  --seq-len 1023 "${data[@]}"
expect_error "missing data" "nothere" \
  "$dtrain" train --dry-run --data "$tmp/nothere.bin"
expect_error "value given" "--dry-run takes no value" \
  "$dtrain" train --dry-run=1 "${data[@]}"

[ $fails -eq 0 ] && echo "test_dry_run: ok" || echo "test_dry_run: $fails failure(s)"
exit $((fails > 0))
