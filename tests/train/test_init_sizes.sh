#!/usr/bin/env bash
# Model sizes given by a file are judged once the file has given them: a
# model of width 96 with 12 heads (the default preset's width, 128, is not
# a multiple of 12) starts from its weights (--init) or its checkpoint
# (--resume) with --n-head 12, and a head count the width does not divide
# is refused with both numbers. Before, validation judged the preset's width
# and refused every such run.
#   test_init_sizes.sh DTRAIN
set -uo pipefail
dtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

fail() { echo "FAIL $1"; cat "$tmp/err"; fails=$((fails + 1)); }

# run NAME CMD...: CMD must succeed.
run() {
  local name=$1; shift
  if timeout 120 "$@" >"$tmp/out" 2>"$tmp/err"; then echo "ok   $name"; else fail "$name (exit $?)"; fi
}

# refuse NAME PATTERN CMD...: CMD exits 1 or 2 (not a signal) with PATTERN on stderr.
refuse() {
  local name=$1 pattern=$2; shift 2
  timeout 120 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -gt 2 ]; then fail "$name: exit status $rc (want 1 or 2)"; return; fi
  if ! grep -Eq "$pattern" "$tmp/err"; then fail "$name: stderr does not match /$pattern/"; return; fi
  echo "ok   $name: $(grep -E "$pattern" "$tmp/err" | head -1)"
}

for _ in $(seq 600); do printf 'a model of width ninety-six. '; done >"$tmp/data.txt"
common=(--data "$tmp/data.txt" --steps 1 --threads 1 --batch-size 2 --eval-batches 0)

# The model: C 96, H 12, one layer, a context (160) longer than the preset's (128).
run "train C96 H12" "$dtrain" train "${common[@]}" --n-embd 96 --n-head 12 --n-layer 1 \
  --block-size 160 --seq-len 32 --save-final "$tmp/w.safetensors" --out "$tmp/run"
[ -s "$tmp/w.safetensors" ] || { echo "FAIL no weights written"; exit 1; }

run "--init with --n-head 12" "$dtrain" train "${common[@]}" --init "$tmp/w.safetensors" --n-head 12
grep -q "n_embd 96" "$tmp/out" || fail "--init: the header does not show n_embd 96"
run "--init with --seq-len 150 (the file's block is 160)" \
  "$dtrain" train "${common[@]}" --init "$tmp/w.safetensors" --seq-len 150
run "--resume with --n-head 12" "$dtrain" train "${common[@]}" --seq-len 32 --steps 2 \
  --out "$tmp/run" --resume --n-head 12
refuse "--init with --n-head 7 (the file records 12)" "n_head 12, but 7 was asked for" \
  "$dtrain" train "${common[@]}" --init "$tmp/w.safetensors" --n-head 7

# The same weights without dtrain's metadata: the head count comes from the
# flag alone, so 12 must load and 7 must be refused for the width, 96.
/usr/bin/python3 - "$tmp/w.safetensors" "$tmp/nometa.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
header.pop("__metadata__", None)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
run "metadata-less --init with --n-head 12" \
  "$dtrain" train "${common[@]}" --init "$tmp/nometa.safetensors" --n-head 12
refuse "metadata-less --init with --n-head 7" "96.*7" \
  "$dtrain" train "${common[@]}" --init "$tmp/nometa.safetensors" --n-head 7

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all cases pass"
