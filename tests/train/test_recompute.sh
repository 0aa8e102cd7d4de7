#!/usr/bin/env bash
# --recompute end to end: a few steps of `dtrain train` with none, selective
# and full give the same losses and gradient norms (as logged) and the same
# final weights (byte for byte); each run carves the activations its mode
# says (the "acts" of the memory line against the closed-form count of
# docs/train.md, worked out here); DeepSpeed's activation_checkpointing
# section turns on full; a mode that does not exist is refused.
#   test_recompute.sh DTRAIN [extra train flags...]
set -uo pipefail
dtrain=$1; shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
. "$(dirname "$0")/helpers.sh"

make_text "$tmp/data.txt" 20000 5
L=3 C=64 NH=4 B=8 T=64 V=256
common=(--data "$tmp/data.txt" --n-layer $L --n-head $NH --n-embd $C --block-size $T
        --batch-size $B --grad-accum 2 --steps 4 --lr 2e-3 --seed 3 --threads 1
        --eval-batches 1 "$@")

run_mode() { # MODE [more flags]: the run's output in $tmp/MODE.out
  local mode=$1; shift
  timeout 300 "$dtrain" train "${common[@]}" "$@" --log-json "$tmp/$mode.json" \
    --save-final "$tmp/$mode.safetensors" > "$tmp/$mode.out" 2>&1 \
    || { echo "FAIL $mode: exit status $?"; cat "$tmp/$mode.out"; fails=$((fails + 1)); }
}

# The logged numbers that must not move: step, loss, grad norm, val loss.
numbers() { sed -E 's/"(ms|tokens_per_s|mfu)":[^,}]*,?//g' "$1"; }
# The arena's MiB at the start: rank 0's acts cell in the table "memory
# per rank at the start" (params, grads, optim, model state, acts).
acts_mib() {
  awk '/^memory per rank at the start/ {t = 1} t && $1 == "rank" {print $11; exit}' "$1"
}
# The closed-form count (docs/train.md): L layers of what the mode keeps,
# one shared layer of what it rebuilds, and 11 N C + 3 N + N V floats that
# no mode changes; N = B T (a multiple of 16 here: no padding).
expected_mib() {
  /usr/bin/python3 - "$1" $L $C $NH $B $T $V <<'PY'
import sys
mode, L, C, NH, B, T, V = sys.argv[1], *map(int, sys.argv[2:])
N = B * T
NC = N * C
kept = {"none": 16 * NC + 4 * N + NH * N, "selective": 10 * NC + NH * N, "full": NC}[mode]
shared = {"none": 0, "selective": 6 * NC + 4 * N, "full": 15 * NC + 4 * N + NH * N}[mode]
print(4 * (L * kept + shared + 11 * NC + 3 * N + N * V) / 1048576)
PY
}
# |a - b| <= tol
close() { /usr/bin/python3 -c "import sys; sys.exit(abs(($1) - ($2)) > $3)"; }

for mode in none selective full; do run_mode $mode --recompute $mode; done

for mode in selective full; do
  if diff <(numbers "$tmp/none.json") <(numbers "$tmp/$mode.json") > "$tmp/diff"; then
    echo "ok   $mode: logged losses and norms equal to none's ($(grep -c loss "$tmp/$mode.json") lines)"
  else
    echo "FAIL $mode: logged numbers differ from none's:"; cat "$tmp/diff"; fails=$((fails + 1))
  fi
  if cmp -s "$tmp/none.safetensors" "$tmp/$mode.safetensors"; then
    echo "ok   $mode: final weights byte for byte none's"
  else
    echo "FAIL $mode: final weights differ from none's"; fails=$((fails + 1))
  fi
done
[ "$(grep -c '"loss"' "$tmp/none.json")" -eq 4 ] \
  || { echo "FAIL: expected 4 logged steps"; fails=$((fails + 1)); }

# The arena of each mode: within rounding (0.05 MiB) and the matmul
# workspace, which the same line counts (0.25 MiB in all); the differences
# between modes, where the workspace cancels, within rounding.
none_mib=$(acts_mib "$tmp/none.out")
for mode in none selective full; do
  got=$(acts_mib "$tmp/$mode.out") want=$(expected_mib $mode)
  grep -q "recompute $mode," "$tmp/$mode.out" \
    || { echo "FAIL $mode: the run's summary does not say 'recompute $mode'"; fails=$((fails + 1)); }
  if [ -n "$got" ] && close "$got" "$want" 0.25 &&
     close "$none_mib - $got" "$(expected_mib none) - $want" 0.1; then
    echo "ok   $mode: acts $got MiB (formula $want)"
  else
    echo "FAIL $mode: acts '$got' MiB, the formula says $want"; fails=$((fails + 1))
  fi
done

# DeepSpeed's section asks for checkpointing: full, with the same numbers;
# dtrain's own key beside it wins.
echo '{"activation_checkpointing": {"partition_activations": false, "profile": false}}' \
  > "$tmp/ds.json"
run_mode ds --config "$tmp/ds.json"
if grep -q "recompute full," "$tmp/ds.out" && cmp -s "$tmp/none.safetensors" "$tmp/ds.safetensors" &&
   [ "$(acts_mib "$tmp/ds.out")" = "$(acts_mib "$tmp/full.out")" ]; then
  echo "ok   activation_checkpointing: recompute full, the same weights"
else
  echo "FAIL activation_checkpointing: not full recomputation:"; head -6 "$tmp/ds.out"
  fails=$((fails + 1))
fi
echo '{"recompute": "selective", "activation_checkpointing": {}}' > "$tmp/ds2.json"
run_mode ds2 --config "$tmp/ds2.json"
grep -q "recompute selective," "$tmp/ds2.out" \
  || { echo "FAIL: dtrain's recompute key did not win over the section"; fails=$((fails + 1)); }

expect_error bad_mode "recompute: unknown value 'partial' \(one of none\|selective\|full\)" \
  "$dtrain" train "${common[@]}" --recompute partial
expect_error ds_cpu "cpu_checkpointing: true is not supported yet" \
  "$dtrain" train "${common[@]}" --config <(echo '{"activation_checkpointing": {"cpu_checkpointing": true}}')

[ $fails -eq 0 ] && echo "ok: recompute" || { echo "$fails failure(s)"; exit 1; }
