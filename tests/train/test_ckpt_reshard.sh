#!/bin/bash
# Sharded checkpoints end to end (issue 11): saved collectively by 3 ranks
# under `dtrain launch`, loaded bit for bit at other rank counts, other
# range cuts, a layout padded otherwise, and whole (test_ckpt_shard.c knows
# every value by tensor and element); a whole-model checkpoint loaded into
# shards; a rank killed during a save leaves the last checkpoint in place;
# `dtrain ckpt info` and `consolidate` (PyTorch the oracle); and damaged
# checkpoints refused with a message naming the fault, nothing written.
#
#   test_ckpt_reshard.sh path/to/dtrain path/to/test_ckpt_shard
cli=$1
drv=$2
here=$(cd "$(dirname "$0")" && pwd)
tool="/usr/bin/python3 $here/ckpt_shard_tool.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
. "$here/helpers.sh"
export DTRAIN_TIMEOUT=60

run=$tmp/run
# ---- resharding -------------------------------------------------------------
expect_ok "save step 10: 3 ranks, padded layout" "$cli" launch -n 3 "$drv" save "$run" 10 pad zero
expect_ok "load step 10 at 1 rank, flat layout" "$drv" check "$run" flat 1 zero 10
expect_ok "load step 10 at 2 ranks, flat layout" "$drv" check "$run" flat 2 zero 10
expect_ok "load step 10 at 3 ranks, same layout" "$drv" check "$run" pad 3 zero 10
expect_ok "load step 10 at 4 ranks, split ranges" "$drv" check "$run" pad 4 split 10
expect_ok "save step 20: 2 ranks, flat layout, split ranges" \
  "$cli" launch -n 2 "$drv" save "$run" 20 flat split
expect_ok "load step 20 at 3 ranks, padded layout" "$drv" check "$run" pad 3 zero 20
expect_ok "whole-model checkpoint" "$drv" full "$tmp/full" 5
expect_ok "whole-model checkpoint into 3 shards" "$drv" check "$tmp/full" pad 3 split 5
expect_error "save with an infinity on rank 1" "rank 1.*refusing to save non-finite values: tensor exp_avg\.[a-z0-9_.]+ holds inf" \
  "$cli" launch -n 3 "$drv" nan "$run" 25
[ "$(cat "$run/latest")" = ckpt-00000020 ] || { echo "FAIL latest moved: $(cat "$run/latest")"; fails=$((fails + 1)); }

# ---- a rank killed during a save --------------------------------------------
# The survivors clean up once they hear of the death; a loaded CI machine
# can take longer than the launcher's default 5 s grace before its SIGTERM.
DTRAIN_CKPT_TEST_EXIT_RANK=1 timeout 120 "$cli" launch -n 3 --grace-period 30 "$drv" save "$run" 30 pad zero \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 0 ]; then echo "FAIL killed save: exit status 0"; fails=$((fails + 1)); fi
ls -a "$run" >"$tmp/ls"
if [ "$(cat "$run/latest")" != ckpt-00000020 ] || grep -q ckpt-00000030 "$tmp/ls"; then
  echo "FAIL killed save: latest is $(cat "$run/latest"); the run holds: $(tr '\n' ' ' <"$tmp/ls")"
  fails=$((fails + 1))
else
  echo "ok   killed save (status $rc): latest is still ckpt-00000020, no ckpt-00000030"
fi
expect_ok "after the killed save, latest loads at 2 ranks" "$drv" check "$run" flat 2 zero 20
expect_ok "the next save succeeds and prunes the dead one's directory" \
  "$cli" launch -n 3 "$drv" save "$run" 40 pad zero
if ls -a "$run" | grep -q '\.tmp\.'; then
  echo "FAIL a temporary directory is left: $(ls -a "$run" | tr '\n' ' ')"; fails=$((fails + 1))
fi

# ---- info and consolidate ---------------------------------------------------
expect_ok "ckpt info" "$cli" ckpt info "$run"
for want in "step: 40" "ZeRO stage 3, 3 ranks" "shard-00002-of-00003.safetensors" \
            "n_layer 2, n_head 2, n_embd 24" "320 sequences consumed"; do
  grep -q "$want" "$tmp/out" || { echo "FAIL ckpt info lacks '$want':"; cat "$tmp/out"; fails=$((fails + 1)); }
done
expect_ok "ckpt consolidate" "$cli" ckpt consolidate "$run" --out "$tmp/model.safetensors"
expect_ok "reference weights" "$drv" ref "$tmp/ref.safetensors"
ckpt=$run/ckpt-00000040
/usr/bin/python3 "$here/ckpt_shard_tool.py" torch "$tmp/model.safetensors" "$tmp/ref.safetensors" "$ckpt" ||
  fails=$((fails + 1))
expect_ok "ckpt info of a whole-model checkpoint" "$cli" ckpt info "$tmp/full"
grep -q "whole model" "$tmp/out" || { echo "FAIL: not named whole model"; fails=$((fails + 1)); }

# ---- damaged checkpoints ----------------------------------------------------
# Each case damages a copy, then: consolidate fails naming the fault and
# leaves the existing output file as it was; a sharded load fails too.
echo "precious" >"$tmp/keep.safetensors"
damaged() {
  local name=$1 pattern=$2
  expect_error "$name: consolidate" "$pattern" \
    "$cli" ckpt consolidate "$tmp/bad" --out "$tmp/keep.safetensors"
  [ "$(cat "$tmp/keep.safetensors")" = precious ] ||
    { echo "FAIL $name: the output file was overwritten"; fails=$((fails + 1)); }
  expect_error "$name: load at 2 ranks" "$pattern" "$drv" check "$tmp/bad" flat 2 zero 40
}
fresh() { rm -rf "$tmp/bad"; cp -r "$ckpt" "$tmp/bad"; }

fresh; rm "$tmp/bad/shard-00001-of-00003.safetensors"
damaged "missing shard" "shard-00001-of-00003.safetensors: missing .*incomplete"
fresh; truncate -s -100 "$tmp/bad/shard-00002-of-00003.safetensors"
damaged "truncated shard" "shard-00002-of-00003.safetensors: [0-9]+ bytes, the manifest says [0-9]+: the shard is truncated"
fresh; printf 'x' | dd of="$tmp/bad/shard-00000-of-00003.safetensors" bs=1 seek=9000 conv=notrunc 2>/dev/null
damaged "a changed byte" "checksum [0-9a-f]+, the manifest says [0-9a-f]+: the shard is damaged"
fresh; $tool edit "$tmp/bad" drop-piece
damaged "a piece missing from the manifest" "tensor wpe.weight is covered to element 0 of 288: a piece is missing"
fresh; $tool edit "$tmp/bad" overlap
damaged "overlapping pieces" "piece wpe.weight\[1:288\] of shard-00000-of-00003.safetensors overlaps"
fresh; $tool edit "$tmp/bad" wrong-size
damaged "a piece of the wrong size" "shard-00000-of-00003.safetensors: tensor [a-z0-9_.]+@0 holds [0-9]+ F32 elements .* needs [0-9]+"
fresh; $tool edit "$tmp/bad" other-model
# (consolidate builds the manifest's model, so the shards are found to
# disagree; a load into the model built says the manifest's is another.)
damaged "another model in the manifest" \
  "its metadata gives n_head 2, the manifest's model has 4: the shard is of another model|manifest.json: the checkpoint's model \(n_layer 2, n_head 4, .*\) is not the one built \(2, 2,"
fresh; cp "$ckpt/manifest.json" "$tmp/m.json"; head -c 200 "$tmp/m.json" >"$tmp/bad/manifest.json"
damaged "a truncated manifest" "manifest.json: not a JSON object"
fresh; piece=$($tool nan "$tmp/bad")
damaged "a NaN in a shard" "shard-00001-of-00003.safetensors: tensor ${piece%@*} holds nan at element ${piece#*@}"

if [ $fails -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "test_ckpt_reshard: ok"
