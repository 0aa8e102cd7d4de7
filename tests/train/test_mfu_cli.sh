#!/usr/bin/env bash
# The MFU on the step lines of `dtrain train` is never shown above 100%:
# against the peak measured on this machine (fp32 and bf16), and on an
# emulated slower machine (DTRAIN_PEAK_GFLOPS far below any CPU), where it
# is shown capped as "100.0%*" with one warning. Then `dtrain bench peak`.
#   test_mfu_cli.sh DTRAIN
set -uo pipefail
dtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export DTRAIN_CACHE=$tmp/cache
unset DTRAIN_PEAK_GFLOPS
fails=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

for i in $(seq 400); do printf 'the quick brown fox jumps over the lazy dog. '; done >"$tmp/text.txt"

# train NAME [VAR=VALUE...] -- [FLAGS...]: 4 tiny steps, one line each.
train() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  if ! timeout 120 env "${envs[@]}" "$dtrain" train --data "$tmp/text.txt" --steps 4 \
      --print-every 1 --eval-batches 0 --batch-size 2 --seq-len 32 "$@" \
      >"$tmp/$name.out" 2>"$tmp/$name.err"; then
    fail "$name: dtrain train failed"; cat "$tmp/$name.err"; return 1
  fi
  grep '^step ' "$tmp/$name.out" >"$tmp/$name.steps"
  local n
  n=$(wc -l <"$tmp/$name.steps")
  [ "$n" -eq 4 ] || { fail "$name: $n step lines, want 4"; cat "$tmp/$name.out"; return 1; }
  if ! grep -q 'MFU [0-9.]*%' "$tmp/$name.steps"; then
    fail "$name: no MFU on the step lines"; cat "$tmp/$name.steps"; return 1
  fi
  # every MFU shown must be at most 100
  local over
  over=$(grep -o 'MFU [0-9.]*%' "$tmp/$name.steps" | awk '{ v = $2 + 0; if (v > 100) print v }')
  [ -z "$over" ] || { fail "$name: MFU above 100%: $over"; cat "$tmp/$name.steps"; return 1; }
  echo "ok   $name: $(grep -o 'MFU [0-9.]*%\**' "$tmp/$name.steps" | tr '\n' ' ')"
}

train fp32 -- --threads 2
train bf16 -- --threads 2 --dtype bf16
train bf16_emulated DTRAIN_BF16_EMULATE=1 -- --threads 1 --dtype bf16

# How bf16 products run sets their bits, so every rank takes the path that
# rank 0's cached loop rates choose, run after run: a cache whose bf16 rate
# is 4x the fp32 one gives the kernel on both ranks, one at a quarter gives
# the fp32 path on both (whatever each rank would time). Only where the
# rates decide (AVX512-BF16 without AMX, oneDNN with a bf16 kernel).
train bf16_one_thread -- --threads 1 --dtype bf16
cache_file=$(ls "$DTRAIN_CACHE"/peak/*.txt 2>/dev/null | head -1)
if [ -n "$cache_file" ] && grep -q '^bf16-avx512 1 ' "$cache_file"; then
  fp32_rate=$(awk '$1 == "f32-avx512" && $2 == 1 { print $3 }' "$cache_file")
  for factor in 4 0.25; do
    sed -i "s/^bf16-avx512 1 .*/bf16-avx512 1 $(awk -v f="$fp32_rate" -v k=$factor 'BEGIN { print f * k }')/" "$cache_file"
    timeout 120 "$dtrain" train --nproc 2 --log-ranks all --data "$tmp/text.txt" --steps 1 \
      --eval-batches 0 --batch-size 2 --seq-len 32 --threads 1 --dtype bf16 \
      >"$tmp/agree$factor.out" 2>&1 || fail "bf16 rates x$factor: the run failed"
    if [ "$factor" = 4 ]; then want='parameters | bf16 matmuls | '; else want="outruns its bf16 dot products"; fi
    n=$(grep -cF -- "$want" "$tmp/agree$factor.out")
    if [ "$n" -eq 2 ]; then echo "ok   bf16 rate x$factor of fp32's in the cache: both ranks say '${want% }'"
    else fail "bf16 rate x$factor: $n of 2 ranks say '${want% }'"; grep 'bf16 matmuls' "$tmp/agree$factor.out"; fi
  done
else
  echo "note: bf16's path does not depend on the loops' rates on this CPU; rank agreement not checked"
fi

# An emulated slower machine: 0.001 GFLOP/s per thread. Each line shows the
# capped value with its marker; the warning comes once.
if train slow DTRAIN_PEAK_GFLOPS=0.001 -- --threads 1; then
  capped=$(grep -c 'MFU 100\.0%\*' "$tmp/slow.steps")
  [ "$capped" -eq 4 ] || { fail "slow: $capped of 4 lines show 'MFU 100.0%*'"; cat "$tmp/slow.steps"; }
  warnings=$(grep -c 'above 100%' "$tmp/slow.err")
  [ "$warnings" -eq 1 ] || { fail "slow: $warnings warnings, want 1"; cat "$tmp/slow.err"; }
fi

# A malformed override stops the run before its first step, named on
# stderr (it is never silently replaced by some other peak).
timeout 60 env DTRAIN_PEAK_GFLOPS=fast "$dtrain" train --data "$tmp/text.txt" --steps 1 \
  --print-every 1 --eval-batches 0 --batch-size 2 --seq-len 32 --threads 1 \
  >"$tmp/bad.out" 2>"$tmp/bad.err"
rc=$?
grep -q 'DTRAIN_PEAK_GFLOPS=fast' "$tmp/bad.err" || { fail "bad override: not named (exit $rc)"; cat "$tmp/bad.err"; }
[ $rc -eq 1 ] || fail "bad override: exit $rc, want 1"
if grep -q '^step ' "$tmp/bad.out"; then fail "bad override: it trained"; fi

# bench peak: a row per loop, what a run measures against, the cache.
if ! timeout 60 "$dtrain" bench peak --threads 2 >"$tmp/peak.out" 2>&1; then
  fail "bench peak failed"; cat "$tmp/peak.out"
else
  for want in "CPU: " "fp32 AVX2 FMA loop" "fp32 AVX-512 FMA loop" "bf16 AVX512-BF16" \
      "measures MFU against:" "fp32: MFU against a measured peak" "cache $DTRAIN_CACHE/peak/"; do
    grep -qF -- "$want" "$tmp/peak.out" || { fail "bench peak: no '$want'"; cat "$tmp/peak.out"; }
  done
fi
# The cache keeps each loop's best: bench peak raises a rate that a slow
# first measurement left low (to what it measures now, which its table
# prints), and never lowers one.
cache_file=$(ls "$DTRAIN_CACHE"/peak/*.txt 2>/dev/null | head -1)
loop=$(awk '$1 ~ /^f32-/ && $2 == 1 { print $1; exit }' "$cache_file" 2>/dev/null)
if [ -z "$loop" ]; then
  fail "no 1-thread fp32 rate in the cache ($cache_file)"
else
  for low_high in 1 1000000; do
    sed -i "s/^$loop 1 .*/$loop 1 $low_high/" "$cache_file"
    timeout 60 "$dtrain" bench peak --threads 1 >"$tmp/peak1.out" 2>&1
    got=$(awk -v l="$loop" '$1 == l && $2 == 1 { print $3 }' "$cache_file")
    desc=$(case $loop in f32-avx512) echo "fp32 AVX-512 FMA loop";; *) echo "fp32 AVX2 FMA loop";; esac)
    measured=$(grep -F -- "$desc" "$tmp/peak1.out" | head -1 | awk '{ print $(NF-1) }')
    if [ "$low_high" = 1 ]; then
      awk -v g="$got" -v m="$measured" 'BEGIN { exit !(g > 1 && g - m < 0.5 && m - g < 0.5) }' ||
        fail "bench peak left a cached rate of 1 at $got (it measured $measured)"
    else
      [ "$got" = 1000000 ] || fail "bench peak lowered a cached rate of 1000000 to $got"
    fi
  done
  echo "ok   the cache keeps each loop's best rate"
fi

for bad in "--threads 0" "--threads" "--threads=x" "--bogus"; do
  # shellcheck disable=SC2086
  "$dtrain" bench peak $bad >/dev/null 2>"$tmp/bad_peak.err"
  rc=$?
  [ $rc -eq 2 ] && [ -s "$tmp/bad_peak.err" ] || fail "bench peak $bad: exit $rc, want 2 with a message"
done

[ $fails -eq 0 ] && echo "train.mfu_cli: ok"
exit $((fails > 0))
