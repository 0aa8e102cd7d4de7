#!/usr/bin/env bash
# `dtrain data prepare` and `dtrain data info` end to end: a text file and
# an llm.c shard written the way llm.c writes them (numpy) become train/val
# shards that hold exactly the tokens training would cut from the file
# itself; every wrong command line is refused with a message.
# usage: test_data_cli.sh path/to/dtrain path/to/test_dataset
set -euo pipefail
DTRAIN=$1
TEST_DATASET=$2
PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

check() { echo "check: $*"; }
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
# expect STATUS "text in stderr+stdout" ARGS...
expect() {
    local want_rc=$1 want_text=$2 rc=0
    shift 2
    "$DTRAIN" "$@" >"$TMP/log" 2>&1 || rc=$?
    [[ $rc == "$want_rc" ]] || { cat "$TMP/log" >&2; fail "'dtrain $*' exited $rc, not $want_rc"; }
    grep -qF -- "$want_text" "$TMP/log" || { cat "$TMP/log" >&2; fail "'dtrain $*': no '$want_text'"; }
}

check "help"
expect 0 "usage: dtrain data prepare --input FILE" data --help
expect 0 "--val-fraction F" data prepare --help
"$DTRAIN" help data | cmp -s - <("$DTRAIN" data --help) || fail "'help data' differs"
"$DTRAIN" help | grep -q "data " || fail "'dtrain help' does not list data"

check "usage errors exit 2 and name the problem"
expect 2 "usage: dtrain data" data
expect 2 "unknown subcommand 'frob'" data frob
expect 2 "--input FILE is required" data prepare
expect 2 "--input FILE is required" data prepare --out "$TMP/x"
expect 2 "option --input needs a value" data prepare --input
expect 2 "unknown option '--bogus'" data prepare --bogus 1 --input x
expect 2 "unexpected argument 'x'" data prepare x
expect 2 "invalid value '1' for --val-fraction" data prepare --input x --val-fraction 1
expect 2 "invalid value 'abc' for --val-fraction" data prepare --input x --val-fraction=abc
expect 2 "invalid value '-0.1' for --val-fraction" data prepare --input x --val-fraction -0.1
expect 2 "empty value for --out" data prepare --input x --out=
expect 2 "expected one FILE" data info

check "bad inputs exit 1 with the file and the problem"
expect 1 "$TMP/none: cannot open" data prepare --input "$TMP/none"
: >"$TMP/empty.txt"
expect 1 "$TMP/empty.txt: empty file" data prepare --input "$TMP/empty.txt"
printf 'abc' >"$TMP/tiny.txt"
expect 1 "3 tokens are too few to hold out a validation fraction of 0.1" \
    data prepare --input "$TMP/tiny.txt" --out "$TMP/tiny"
$PY -c 'import struct, sys
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, 10, *[0] * 253) + b"\0" * 18)' \
    "$TMP/cut.bin"
expect 1 "truncated: the header says 10 tokens, so the file should be 1044 bytes, but it is 1042" \
    data prepare --input "$TMP/cut.bin"
[[ ! -e "$TMP/tiny" ]] || fail "a failed prepare created its output directory"

check "text -> byte-level shards, val = last 10%"
$PY -c 'import sys, random
random.seed(1)
open(sys.argv[1], "w").write("".join(random.choice("abc def\n") for _ in range(10007)))' "$TMP/t.txt"
expect 0 "wrote $TMP/out/a/train.bin: 9006 tokens" data prepare --input "$TMP/t.txt" --out "$TMP/out/a"
grep -qF "wrote $TMP/out/a/val.bin: 1001 tokens" "$TMP/log" || fail "val count"
grep -qF "10007 tokens (byte-level text, vocabulary 256)" "$TMP/log" || fail "summary"
cat >"$TMP/check.py" <<'PYEOF'
import struct, sys
def tokens(path):
    raw = open(path, "rb").read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    assert (magic, version) == (20240520, 1) and len(raw) == 1024 + 2 * n, path
    return list(struct.unpack(f"<{n}H", raw[1024:]))
src, frac, train, val = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
raw = open(src, "rb").read()
if raw[:4] == struct.pack("<i", 20240520):
    want = tokens(src)
else:
    want = list(raw)
cut = len(want) - int(len(want) * frac + 0.5)
assert tokens(train) == want[:cut], "train part differs"
if frac > 0:
    assert tokens(val) == want[cut:], "val part differs"
PYEOF
$PY "$TMP/check.py" "$TMP/t.txt" 0.1 "$TMP/out/a/train.bin" "$TMP/out/a/val.bin"
"$TEST_DATASET" same-split "$TMP/t.txt" 0.1 "$TMP/out/a/train.bin" "$TMP/out/a/val.bin"
[[ $(ls "$TMP/out/a") == $'train.bin\nval.bin' ]] || fail "extra files: $(ls "$TMP/out/a")"
expect 0 "text (byte-level tokens), 10007 tokens, vocabulary 256" data info "$TMP/t.txt"
expect 0 "llm.c token shard, 9006 tokens, vocabulary 256" data info "$TMP/out/a/train.bin"

check "--val-fraction=0.25 and 0"
expect 0 "val.bin: 2502 tokens" data prepare --input "$TMP/t.txt" --out "$TMP/out/b" --val-fraction=0.25
$PY "$TMP/check.py" "$TMP/t.txt" 0.25 "$TMP/out/b/train.bin" "$TMP/out/b/val.bin"
expect 0 "train.bin: 10007 tokens" data prepare --input "$TMP/t.txt" --out "$TMP/out/c" --val-fraction 0
[[ ! -e "$TMP/out/c/val.bin" ]] || fail "val.bin written with --val-fraction 0"

check "default --out is the current directory"
(cd "$TMP" && "$DTRAIN" data prepare --input t.txt >/dev/null) || fail "prepare into ."
cmp -s "$TMP/train.bin" "$TMP/out/a/train.bin" || fail "./train.bin differs"

check "an llm.c shard written with numpy (GPT-2 token ids) is split as it is"
$PY - "$TMP/gpt2.bin" <<'PYEOF'
import sys, numpy as np
rng = np.random.default_rng(0)
toks = rng.integers(0, 50257, size=5000).astype(np.uint16)
toks[17] = 50256
header = np.zeros(256, dtype=np.int32)
header[0], header[1], header[2] = 20240520, 1, len(toks)
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(toks.tobytes())
PYEOF
expect 0 "llm.c token shard, 5000 tokens, vocabulary 50257" data info "$TMP/gpt2.bin"
expect 0 "5000 tokens (llm.c shard, vocabulary 50257)" data prepare --input "$TMP/gpt2.bin" --out "$TMP/g"
$PY "$TMP/check.py" "$TMP/gpt2.bin" 0.1 "$TMP/g/train.bin" "$TMP/g/val.bin"
"$TEST_DATASET" same-split "$TMP/gpt2.bin" 0.1 "$TMP/g/train.bin" "$TMP/g/val.bin"
# the parts keep the file's vocabulary, whatever their own largest token
expect 0 "llm.c token shard, 500 tokens, vocabulary 50257" data info "$TMP/g/val.bin"

echo "ok"
