#!/usr/bin/env bash
# The memory table of a training run (2 ranks, DDP): at the start and at the
# end each rank's bytes by kind beside the formula's, and the peak RSS. The
# tiny model's Psi = 842,496: 4 Psi = 3.2 MiB, 8 Psi = 6.4 MiB; the
# buffers' 64-byte alignment puts the measured figures a little above.
#   test_memory_table.sh DTRAIN
set -uo pipefail
dtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

. "$(dirname "$0")/helpers.sh"

make_text "$tmp/text.txt" 3000 1
expect_ok "train 1 step on 2 ranks" timeout 120 "$dtrain" train --nproc 2 --threads 1 --steps 1 \
  --batch-size 2 --seq-len 32 --eval-batches 0 --data "$tmp/text.txt"
cp "$tmp/out" "$tmp/run"

# check_table TITLE: the table under TITLE names the setting and has one row
# per rank whose params, grads, optim and model-state ratios lie in
# [1, 1.01] and whose activations equal the estimate.
check_table() {
  local title=$1
  awk -v title="$title" '
    index($0, title ": Psi = 842496 parameters, fp32, adamw (K = 8") == 1 { on = 1; next }
    on && /^  formula  4 Psi +4 Psi +8 Psi +16 Psi / { formula = 1 }
    on && /^  rank [0-9]/ {
      rows++
      for (i = 4; i <= 10; i += 2) {
        r = substr($i, 2) + 0
        if ($i !~ /^x/ || r < 1 || r > 1.01) { print "ratio " $i " in: " $0; bad = 1 }
      }
      if ($12 != "x1.0000") { print "acts " $12 " in: " $0; bad = 1 }
      if ($0 !~ /peak RSS [0-9]/) { print "no peak RSS in: " $0; bad = 1 }
      if (rows == 2) exit
    }
    END { if (!formula || rows != 2 || bad) exit 1 }' "$tmp/run"
}

for title in "memory per rank at the start" "peak memory per rank"; do
  if check_table "$title"; then
    echo "ok   $title"
  else
    echo "FAIL $title:"; cat "$tmp/run"; fails=$((fails + 1))
  fi
done

[ $fails -eq 0 ] && echo "test_memory_table: ok" || echo "test_memory_table: $fails failure(s)"
exit $((fails > 0))
