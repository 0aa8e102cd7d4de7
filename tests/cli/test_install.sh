#!/usr/bin/env bash
# `cmake --install` into a prefix of its own, then everything from there:
# the installed dtrain runs a job and reads GPT-2's vocabulary from its
# share/, a C program built with pkg-config against the installed header
# and library runs under it, and (with dtrain_torch) PyTorch imports the
# installed package, whose module loads the installed libdtrain.
#
#   test_install.sh DTRAIN BUILD_DIR SOURCE_DIR [PYTHON]   (PYTHON: with dtrain_torch)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BUILD=${2:?build dir}
SRC=${3:?source dir}
PY=${4:-}
P="$TMP/prefix with space"

check "cmake --install puts the CLI, the library, its header and pkg-config file under the prefix"
cmake --install "$BUILD" --prefix "$P" >"$TMP/install.log"
for f in bin/dtrain include/dtrain/comm.h; do
    [[ -e "$P/$f" ]] || fail "$f was not installed ($(cat "$TMP/install.log"))"
done
LIB=$(dirname "$(find "$P" -name libdtrain.so | head -1)")
PC=$(find "$P" -name dtrain.pc | head -1)
[[ -n "$LIB" && -n "$PC" ]] || fail "no libdtrain.so or dtrain.pc under the prefix"
expect_eq "$("$P/bin/dtrain" --version)" "$("$DTRAIN" --version)" "the installed dtrain's version"

check "a C program built with pkg-config against the install runs 2 ranks under the installed launcher"
flags=$(PKG_CONFIG_PATH=$(dirname "$PC") pkg-config --cflags --libs dtrain)
# pkg-config escapes the prefix's space with a backslash: eval undoes it.
eval "cc -std=c11 -o \"\$TMP/hello\" \"\$SRC/examples/hello_collectives.c\" $flags" 2>"$TMP/cc.err" ||
    fail "building against the install failed: $(cat "$TMP/cc.err")"
resolved=$(ldd "$TMP/hello" | sed -n 's/^[[:space:]]*libdtrain.so => \(.*\) (0x[0-9a-f]*)$/\1/p')
expect_eq "$(readlink -f "$resolved")" "$(readlink -f "$LIB/libdtrain.so")" "the libdtrain it loads"
"$P/bin/dtrain" launch -n 2 "$TMP/hello" >"$TMP/hello.out"
expect_contains "$TMP/hello.out" "allreduce: sum of ranks = 1 (expected 1)" "the all-reduce"
expect_contains "$TMP/hello.out" "allgather: 0 1" "the all-gather"

VOCAB="$P/share/dtrain/gpt2"
if [[ -f "$VOCAB/encoder.json" ]]; then
    check "the installed dtrain reads GPT-2's vocabulary from its own share/"
    printf 'hello world, said the installed dtrain\n' >"$TMP/text.txt"
    "$P/bin/dtrain" data prepare --input "$TMP/text.txt" --tokenizer gpt2 --val-fraction 0 \
        --out "$TMP/tok" >"$TMP/tok.out" 2>&1 || fail "tokenizing: $(cat "$TMP/tok.out")"
    expect_contains "$TMP/tok.out" "vocabulary 50257" "the tokenizer's vocabulary"
    # The same run with the installed copy spoilt must fail naming it: so
    # it was that copy that was read, not the source tree's.
    echo '{' >"$VOCAB/encoder.json"
    rc=0
    "$P/bin/dtrain" data prepare --input "$TMP/text.txt" --tokenizer gpt2 --val-fraction 0 \
        --out "$TMP/tok2" >"$TMP/tok2.out" 2>&1 || rc=$?
    [[ $rc -ne 0 ]] || fail "a spoilt share/dtrain/gpt2/encoder.json was not read"
    expect_contains "$TMP/tok2.out" "share/dtrain/gpt2" "the error naming the installed copy"
else
    echo "note: GPT-2's vocabulary is not in the source tree (scripts/deps.sh), none installed"
fi

if [[ -n "$PY" ]]; then
    check "PyTorch imports the installed dtrain_torch, which loads the installed libdtrain"
    PKG=$(dirname "$(dirname "$(find "$P" -path '*dtrain_torch/__init__.py' | head -1)")")
    [[ -d "$PKG/dtrain_torch" ]] || fail "dtrain_torch was not installed"
    cat >"$TMP/ar.py" <<'PYEOF'
import sys, torch, torch.distributed as dist, dtrain_torch
dist.init_process_group("dtrain")
x = torch.arange(5, dtype=torch.float32) * (dist.get_rank() + 1)
dist.all_reduce(x)
maps = [l.split(None, 5)[-1].strip() for l in open("/proc/self/maps") if l.rstrip().endswith("libdtrain.so")]
print("rank %d sum %s from %s lib %s" % (dist.get_rank(), x.tolist(), dtrain_torch.__file__,
                                          sorted(set(maps))))
PYEOF
    (cd "$TMP" && PYTHONPATH="$PKG" "$P/bin/dtrain" launch -n 2 "$PY" "$TMP/ar.py") >"$TMP/py.out"
    lib=$(readlink -f "$LIB/libdtrain.so")
    for r in 0 1; do
        expect_contains "$TMP/py.out" "rank $r sum [0.0, 3.0, 6.0, 9.0, 12.0] from $PKG/dtrain_torch/__init__.py lib ['$lib']" \
            "rank $r's all-reduce through the installed package"
    done
fi
echo "PASS"
