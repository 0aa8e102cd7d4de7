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

# The gradients are communication memory (dt_alloc_shared): each rank pulls
# its peer's through a mapping, whose pages its peak RSS counts; the row
# says how much of the RSS that is. DDP's all-reduce reads the peer's
# gradients and nothing else of it: the figure is the grads column (its
# region adds a page or so), and none is mapped before the first step.
if awk '
  index($0, "memory per rank at the start") == 1 { start = 1; peak = 0; next }
  index($0, "peak memory per rank") == 1 { peak = 1; start = 0; next }
  start && /^  rank [0-9]/ && /peers. buffers mapped/ { print "mapped at the start: " $0; bad = 1 }
  peak && /^  rank [0-9]/ {
    rows++
    if (!match($0, /peers. buffers mapped [0-9.]+ of it/)) { print "no peers line: " $0; bad = 1; next }
    split(substr($0, RSTART, RLENGTH), w, " ")
    if (w[4] < $5 || w[4] > $5 + 0.1) { print "mapped " w[4] " MiB, grads " $5 ": " $0; bad = 1 }
  }
  END { exit !(rows == 2 && !bad) }' "$tmp/run"; then
  echo "ok   the peers' gradients mapped, and counted beside the RSS"
else
  echo "FAIL the peers' mapped gradients:"; cat "$tmp/run"; fails=$((fails + 1))
fi

[ $fails -eq 0 ] && echo "test_memory_table: ok" || echo "test_memory_table: $fails failure(s)"
exit $((fails > 0))
