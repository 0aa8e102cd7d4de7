#!/usr/bin/env bash
# The tokenizers end to end through `dtrain`: bad ranks files, flags and
# shards are refused with messages naming what was wrong (exit 1 for bad
# input, 2 for a bad command line); a run on data prepared with a
# tokenizer records it, and `dtrain sample` decodes with it: trained on
# one sentence, the greedy continuation of its start is the sentence.
#   test_tokenizer_cli.sh DTRAIN
set -euo pipefail
dtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PY=/usr/bin/python3

fail() {
    echo "FAIL: $*" >&2
    exit 1
}
# expect STATUS "text in stderr+stdout" ARGS...
expect() {
    local want_rc=$1 want_text=$2 rc=0
    shift 2
    "$dtrain" "$@" >"$tmp/log" 2>&1 || rc=$?
    [[ $rc == "$want_rc" ]] || { cat "$tmp/log" >&2; fail "'dtrain $*' exited $rc, not $want_rc"; }
    grep -qF -- "$want_text" "$tmp/log" ||
        { cat "$tmp/log" >&2; fail "'dtrain $*': no '$want_text'"; }
    echo "ok: dtrain $* -> $rc, '$want_text'"
}

# ranks.py OUT TOKEN...: the 256 bytes, then each TOKEN, ranked in order
cat >"$tmp/ranks.py" <<'PYEOF'
import base64, sys
toks = [bytes([b]) for b in range(256)] + [t.encode() for t in sys.argv[2:]]
open(sys.argv[1], "w").write("".join("%s %d\n" % (base64.b64encode(t).decode(), r)
                                     for r, t in enumerate(toks)))
PYEOF
words=(the " quick" " brown" " fox" " jumps" " over" " lazy" " dog" " the")
$PY "$tmp/ranks.py" "$tmp/words.tiktoken" "${words[@]}"
sentence="the quick brown fox jumps over the lazy dog. "
for _ in $(seq 300); do printf '%s' "$sentence"; done >"$tmp/data.txt"

echo "== bad ranks files: exit 1, the file, the line and the values"
printf 'IQ== 0\nIg== 0\n' >"$tmp/duprank.tiktoken"
expect 1 "duprank.tiktoken:2: rank 0 is given twice (line 1 has it too)" \
    data prepare --input "$tmp/data.txt" --tokenizer "$tmp/duprank.tiktoken" --out "$tmp/x"
[[ ! -e "$tmp/x" ]] || fail "a failed prepare left its output directory"
$PY "$tmp/ranks.py" "$tmp/duptok.tiktoken" ab cd ab
expect 1 "duptok.tiktoken:259: token 'YWI=' (rank 258) is given twice: line 257 gave it rank 256" \
    data prepare --input "$tmp/data.txt" --tokenizer "$tmp/duptok.tiktoken" --out "$tmp/x"
printf 'IQ== 0\nI*== 1\n' >"$tmp/b64.tiktoken"
expect 1 "b64.tiktoken:2: token 'I*==' (rank 1) is not base64: '*' at column 2" \
    data prepare --input "$tmp/data.txt" --tokenizer "$tmp/b64.tiktoken" --out "$tmp/x"
expect 1 "end of text 5 is a rank of $tmp/words.tiktoken already" \
    data prepare --input "$tmp/data.txt" --tokenizer "$tmp/words.tiktoken" --eot-id 5 --out "$tmp/x"
DTRAIN_GPT2_DIR="$tmp/nowhere" expect 1 "run scripts/deps.sh" \
    data prepare --input "$tmp/data.txt" --tokenizer gpt2 --out "$tmp/x"

echo "== bad command lines: exit 2"
expect 2 "--split-pattern needs --tokenizer" \
    data prepare --input "$tmp/data.txt" --split-pattern gpt2
expect 2 "--eot-id needs --tokenizer" data prepare --input "$tmp/data.txt" --eot-id 7
expect 2 "--doc-separator needs --tokenizer" data prepare --input "$tmp/data.txt" --doc-separator x
expect 2 "invalid value 'p50k' for --split-pattern: expected gpt2 or cl100k" \
    data prepare --input "$tmp/data.txt" --tokenizer gpt2 --split-pattern p50k
expect 2 "invalid value '-3' for --eot-id" data prepare --input "$tmp/data.txt" --tokenizer gpt2 \
    --eot-id -3
expect 2 "--doc-separator: '\\q' is not" data prepare --input "$tmp/data.txt" --tokenizer gpt2 \
    --doc-separator '\q'

echo "== a shard whose tokens pass its vocabulary: refused wherever it is read"
$PY - "$tmp/beyond.bin" <<'PYEOF'
import struct, sys
toks = [5, 6, 7, 60000, 8]
hdr = struct.pack("<256i", 20240520, 1, len(toks), 50257, *[0] * 252)
open(sys.argv[1], "wb").write(hdr + struct.pack("<%dH" % len(toks), *toks))
PYEOF
msg="beyond.bin: token 60000 at position 3 is beyond the vocabulary of 50257 its header records"
expect 1 "$msg" data info "$tmp/beyond.bin"
expect 1 "$msg" data prepare --input "$tmp/beyond.bin" --out "$tmp/x"
expect 1 "$msg" train --data "$tmp/beyond.bin" --steps 1 --n-layer 1 --n-embd 16 --n-head 1 \
    --block-size 2 --eval-batches 0 --out "$tmp/x"

echo "== a run records its data's tokenizer, and sample decodes with it"
expect 0 "tokens (tokenizer $tmp/words.tiktoken, vocabulary 266, end of text 265)" \
    data prepare --input "$tmp/data.txt" --tokenizer "$tmp/words.tiktoken" --out "$tmp/words" \
    --val-fraction 0
expect 0 "vocabulary 266, tokenizer $tmp/words.tiktoken (split cl100k, end of text 265)" \
    data info "$tmp/words/train.bin"
expect 1 "is an llm.c shard, tokens already: --tokenizer is for text" \
    data prepare --input "$tmp/words/train.bin" --tokenizer gpt2 --out "$tmp/x"
"$dtrain" train --data "$tmp/words/train.bin" --n-layer 2 --n-head 2 --n-embd 64 \
    --block-size 32 --batch-size 8 --steps 120 --lr 3e-3 --threads 1 --eval-batches 0 \
    --out "$tmp/run" >/dev/null
grep -q "\"spec\":[[:space:]]*\"$tmp/words.tiktoken\"" "$tmp/run"/ckpt-*/state.json ||
    fail "state.json records no tokenizer: $(cat "$tmp/run"/ckpt-*/state.json)"
got=$("$dtrain" sample --ckpt "$tmp/run" --prompt "the quick" --tokens 14 --top-k 1)
want="the quick brown fox jumps over the lazy dog. the quick brown fox jumps over"
[[ $got == "$want" ]] || fail "greedy continuation: got '$got', want '$want'"
echo "ok: greedy continuation in the tokenizer's tokens: $got"
# the safetensors alone records nothing: --tokenizer says which
expect 1 "has a vocabulary of 266 and records no tokenizer: give --tokenizer" \
    sample --ckpt "$tmp/run/ckpt-00000120/model.safetensors" --tokens 2
expect 0 "the quick brown" sample --ckpt "$tmp/run/ckpt-00000120/model.safetensors" \
    --tokenizer "$tmp/words.tiktoken" --prompt "the quick" --tokens 1 --top-k 1
# the tokenizer's file changed since: refused, not decoded wrong
$PY "$tmp/ranks.py" "$tmp/words.tiktoken" "${words[@]:0:8}" " cat"
expect 1 "is not the one recorded" sample --ckpt "$tmp/run" --tokens 2
$PY "$tmp/ranks.py" "$tmp/moved.tiktoken" "${words[@]}"
expect 0 "the quick brown" sample --ckpt "$tmp/run" --tokenizer "$tmp/moved.tiktoken" \
    --prompt "the quick" --tokens 1 --top-k 1
echo "all tokenizer command lines behave"
