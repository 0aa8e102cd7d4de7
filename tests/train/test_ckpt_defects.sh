#!/usr/bin/env bash
# Checkpoints that were hand-edited or damaged, and weights that are not
# finite: `dtrain train --resume` and `dtrain sample` refuse each with a
# message naming the file and what is wrong, and never resume into a wrong
# run, save non-finite weights or print text from them. `dtrain ckpt info`
# checks the files it reports on (a missing, truncated or foreign shard
# fails it), a sharded checkpoint without its manifest is named as such,
# and `dtrain ckpt consolidate` neither writes into the checkpoint it reads
# nor reads one whose run is still training (its lock).
#   test_ckpt_defects.sh DTRAIN
set -uo pipefail
dtrain=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
bg=
trap 'if [ -n "$bg" ]; then kill -9 "$bg"; fi 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
. "$here/helpers.sh"

make_text "$tmp/data.txt" 5000 1
common=(--data "$tmp/data.txt" --n-layer 1 --n-head 2 --n-embd 16 --block-size 16
        --batch-size 2 --threads 1 --eval-batches 0 --seed 5)
"$dtrain" train "${common[@]}" --steps 2 --out "$tmp/base" >/dev/null || exit 1
[ -f "$tmp/base/ckpt-00000002/state.json" ] || { echo "FAIL: no checkpoint"; exit 1; }

# A copy of the run; PY (Python) edits it in place: `state` is the dict
# of state.json, `ck` the checkpoint directory, and the helpers of
# tests/pylib are at hand. RUN is the copy's name.
edit() {
  rm -rf "${tmp:?}/$1"
  cp -r "$tmp/base" "$tmp/$1"
  /usr/bin/python3 - "$tmp/$1/ckpt-00000002" "$here/../pylib" "$2" <<'PY'
import json, sys
ck = sys.argv[1]
sys.path.insert(0, sys.argv[2])
if "st_" in sys.argv[3]:  # torch takes seconds to import
    from dtrain_ref import st_read, st_write
state = json.load(open(ck + "/state.json"))
exec(sys.argv[3])
open(ck + "/state.json", "w").write(json.dumps(state))
PY
  [ $? -eq 0 ] || { echo "FAIL: editing $1"; fails=$((fails + 1)); }
}
# "${resume[@]}" RUN continues a copy to step 4.
resume=("$dtrain" train "${common[@]}" --steps 4 --resume --out)

# state_error NAME PY PATTERN: after PY, resuming fails with PATTERN, which
# follows the path of the copy's state.json.
state_error() {
  edit "$1" "$2"
  expect_error "state.json: $1" "$1/ckpt-00000002/state.json: $3" "${resume[@]}" "$tmp/$1"
}

# ---- state.json: every field checked for type, range and consistency ----
state_error step_huge 'state["step"] = 1e300' \
  '"step" is 1e\+300; it must be an integer from 0 to [0-9]+'
state_error step_negative 'state["step"] = -1' '"step" is -1; it must be an integer from 0'
state_error step_fraction 'state["step"] = 2.5' '"step" is 2.5; it must be an integer'
state_error step_string 'state["step"] = "2"' '"step" is "2"; it must be an integer'
state_error step_missing 'del state["step"]' '"step" is missing'
state_error seq_negative 'state["seq_counter"] = "-1"' \
  '"seq_counter" is "-1"; it must be an integer from 0 to 9223372036854775807'
state_error seq_overflow 'state["seq_counter"] = "18446744073709551616"' \
  '"seq_counter" is "18446744073709551616"; it must be an integer from 0'
state_error seq_garbage 'state["seq_counter"] = "4x"' '"seq_counter" is "4x"; it must be an integer'
state_error seq_behind 'state["seq_counter"] = "1"' \
  '"seq_counter" is 1, fewer than the 2 steps taken \(each takes at least one sequence\)'
state_error format_2 'state["format"] = 2' '"format" is 2; this dtrain reads format 1'
state_error format_missing 'del state["format"]' '"format" is missing'
state_error opt_step_negative 'state["optimizer_step"] = -1' \
  '"optimizer_step" is -1; it must be an integer from 0 to 2147483646'
state_error opt_step_huge 'state["optimizer_step"] = 1e10' '"optimizer_step" is 10000000000; it must be'
state_error shuffle_2 'state["shuffle"] = 2' '"shuffle" is 2; it must be an integer from 0 to 1'
state_error seq_len_0 'state["seq_len"] = 0' '"seq_len" is 0; it must be an integer from 1 to'
state_error batch_0 'state["global_batch"] = 0' '"global_batch" is 0; it must be an integer from 1'
state_error seed_negative 'state["seed"] = "-5"' '"seed" is "-5"; it must be an integer from 0 to 18446744073709551615'
state_error loss_string 'state["last_loss"] = "x"' '"last_loss" is "x"; it must be a number'
state_error tokens_negative 'state["data_tokens"] = "-3"' '"data_tokens" is "-3"; it must be an integer'
state_error optimizer_unknown 'state["optimizer"] = "lion"' '"optimizer" is "lion"; it must be adamw, adam or sgd'
state_error model_n_head 'state["model"]["n_head"] = 4' \
  '"model.n_head" is 4, but .*model.safetensors records n_head 2'
state_error model_n_embd 'state["model"]["n_embd"] = 32' \
  '"model.n_embd" is 32, but .*model.safetensors holds n_embd 16'
edit not_json ''
printf '{"step": 2,' > "$tmp/not_json/ckpt-00000002/state.json"
expect_error "state.json: not JSON" "not_json/ckpt-00000002/state.json: not valid JSON" \
  "${resume[@]}" "$tmp/not_json"

# ---- the weights file: the state is the authority; bytes must tile --------
edit head_meta '
t, meta = st_read(ck + "/model.safetensors")
meta["n_head"] = "4"
st_write(ck + "/model.safetensors", t, meta)'
expect_error "weights metadata disagrees with the state" \
  'head_meta/ckpt-00000002/state.json: "model.n_head" is 2, but .*model.safetensors records n_head 4' \
  "${resume[@]}" "$tmp/head_meta"
expect_error "sample: weights metadata disagrees with the state" \
  'head_meta/ckpt-00000002/state.json: "model.n_head" is 2, but .*model.safetensors records n_head 4' \
  "$dtrain" sample --ckpt "$tmp/head_meta" --tokens 5
edit trailing 'open(ck + "/model.safetensors", "ab").write(b"\0" * 16)'
expect_error "trailing bytes after the weights" \
  'trailing/ckpt-00000002/model.safetensors: 16 bytes after the last tensor' "${resume[@]}" "$tmp/trailing"

# ---- non-finite values are refused where they enter ----------------------
edit nan_weights '
t, meta = st_read(ck + "/model.safetensors")
t["h.0.attn.c_proj.weight"][3, 5] = float("nan")
st_write(ck + "/model.safetensors", t, meta)'
expect_error "resume: NaN weights" \
  'nan_weights/ckpt-00000002/model.safetensors: tensor h.0.attn.c_proj.weight holds nan at element 53' \
  "${resume[@]}" "$tmp/nan_weights"
expect_error "sample: NaN weights" \
  'model.safetensors: tensor h.0.attn.c_proj.weight holds nan at element 53' \
  "$dtrain" sample --ckpt "$tmp/nan_weights" --tokens 5
edit inf_moments '
t, meta = st_read(ck + "/optimizer.safetensors")
t["exp_avg.wte.weight"][0, 0] = float("-inf")
st_write(ck + "/optimizer.safetensors", t, meta)'
expect_error "resume: infinite moments" \
  'optimizer.safetensors: tensor exp_avg.wte.weight holds -inf at element 0' "${resume[@]}" "$tmp/inf_moments"
edit negative_moments '
t, meta = st_read(ck + "/optimizer.safetensors")
t["exp_avg_sq.ln_f.bias"][2] = -1.0
st_write(ck + "/optimizer.safetensors", t, meta)'
expect_error "resume: negative second moment" \
  'optimizer.safetensors: tensor exp_avg_sq.ln_f.bias holds -1 at element 2; a second moment cannot be negative' \
  "${resume[@]}" "$tmp/negative_moments"
# Finite weights whose logits overflow: sampling stops, never prints junk.
edit inf_logits '
t, meta = st_read(ck + "/model.safetensors")
t["ln_f.weight"][:] = 3e38
t["ln_f.bias"][:] = 3e38
st_write(ck + "/model.safetensors", t, meta)'
expect_error "sample: logits not finite" 'the logits .* are not finite' \
  "$dtrain" sample --ckpt "$tmp/inf_logits" --tokens 5

# A learning rate that overflows makes the weights non-finite after the
# first update: the run stops there, or the checkpoint of that step is
# refused, so no run directory ever names non-finite weights as `latest`.
expect_error "non-finite weights are never saved" \
  '(weights non-finite|refusing to save non-finite weights): tensor [a-z0-9_.]+ holds (nan|-?inf) at element [0-9]+' \
  "$dtrain" train "${common[@]}" --steps 3 --lr 1e300 --save-every 1 --out "$tmp/blowup"
if compgen -G "$tmp/blowup/ckpt-*" >/dev/null || [ -e "$tmp/blowup/latest" ]; then
  echo "FAIL: a checkpoint of non-finite weights was saved: $(ls -A "$tmp/blowup")"
  fails=$((fails + 1))
fi

# ---- ckpt info checks what it reports on (issue 12) -----------------------
# A sharded checkpoint (ZeRO-1, 2 ranks), and one of another seed whose
# shards have the same sizes but other bytes.
for seed in 5 6; do
  "$dtrain" train "${common[@]}" --seed $seed --steps 2 --nproc 2 --zero-stage 1 \
    --out "$tmp/z$seed" >/dev/null || { echo "FAIL: the sharded run of seed $seed"; exit 1; }
done
zck=ckpt-00000002
# info_checked RUN: info succeeds and says it checked the 2 files.
info_checked() {
  expect_ok "ckpt info of the sound $1" "$dtrain" ckpt info "$tmp/$1"
  grep -q "checked: 2 file(s)" "$tmp/out" ||
    { echo "FAIL: info does not say what it checked:"; cat "$tmp/out"; fails=$((fails + 1)); }
}
info_checked z5
info_checked base
# copy NAME SRC: a fresh copy of run SRC at $tmp/NAME.
copy() { rm -rf "${tmp:?}/$1"; cp -r "$tmp/$2" "$tmp/$1"; }
copy zmiss z5; rm "$tmp/zmiss/$zck/shard-00001-of-00002.safetensors"
expect_error "ckpt info: a missing shard" \
  "zmiss/$zck/shard-00001-of-00002.safetensors: missing \(the manifest lists it as rank 1's" \
  "$dtrain" ckpt info "$tmp/zmiss"
copy ztrunc z5; truncate -s -100 "$tmp/ztrunc/$zck/shard-00000-of-00002.safetensors"
expect_error "ckpt info: a truncated shard" \
  "ztrunc/$zck/shard-00000-of-00002.safetensors: [0-9]+ bytes, the manifest says [0-9]+: the" \
  "$dtrain" ckpt info "$tmp/ztrunc"
copy zforeign z5; cp "$tmp/z6/$zck/shard-00001-of-00002.safetensors" "$tmp/zforeign/$zck/"
expect_error "ckpt info: a shard of another run" \
  "zforeign/$zck/shard-00001-of-00002.safetensors: checksum [0-9a-f]+, the manifest says" \
  "$dtrain" ckpt info "$tmp/zforeign"
copy wmiss base; rm "$tmp/wmiss/ckpt-00000002/optimizer.safetensors"
expect_error "ckpt info: a whole-model checkpoint without its optimizer file" \
  "wmiss/ckpt-00000002/optimizer.safetensors: cannot open" "$dtrain" ckpt info "$tmp/wmiss"

# ---- a sharded checkpoint without its manifest ----------------------------
copy znoman z5; rm "$tmp/znoman/$zck/manifest.json"
noman="znoman/$zck/manifest.json is missing: .*znoman/$zck holds the shards of a sharded"
noman+=" checkpoint \(shard-0000[01]-of-00002.safetensors"
expect_error "no manifest: ckpt info of the run" "$noman" "$dtrain" ckpt info "$tmp/znoman"
expect_error "no manifest: ckpt info of the checkpoint" "$noman" \
  "$dtrain" ckpt info "$tmp/znoman/$zck"
expect_error "no manifest: resume" "$noman" "${resume[@]}" "$tmp/znoman"
expect_error "no manifest: consolidate" "$noman" \
  "$dtrain" ckpt consolidate "$tmp/znoman" --out "$tmp/noman.safetensors"

# ---- consolidate leaves the checkpoint it reads as it was ----------------
# fingerprint DIR: every name and every file's bytes under DIR.
fingerprint() {
  (cd "$1" && find . -print0 | sort -z | xargs -0 ls -ld --time-style=+ -- &&
   find . -type f -print0 | sort -z | xargs -0 md5sum)
}
copy zout z5
before=$(fingerprint "$tmp/zout")
ln -s "zout/$zck" "$tmp/cklink"
for out in "$tmp/zout/$zck/model.safetensors" "$tmp/zout/$zck/shard-00000-of-00002.safetensors" \
           "$tmp/zout/$zck/../$zck/new.safetensors" "$tmp/cklink/new.safetensors"; do
  expect_error "consolidate --out ${out#"$tmp"/}" \
    "--out .*: inside the checkpoint it reads \(.*zout/$zck\); writing it would change" \
    "$dtrain" ckpt consolidate "$tmp/zout" --out "$out"
done
for name in latest .lock; do
  expect_error "consolidate --out the run's $name" \
    "--out .*zout/$name: the .* of the run directory it reads" \
    "$dtrain" ckpt consolidate "$tmp/zout" --out "$tmp/zout/$name"
done
ln -s "zout/$zck/manifest.json" "$tmp/manlink"
expect_error "consolidate --out a link into the checkpoint" \
  "--out .*manlink: inside the checkpoint it reads" \
  "$dtrain" ckpt consolidate "$tmp/zout" --out "$tmp/manlink"
[ "$(fingerprint "$tmp/zout")" = "$before" ] ||
  { echo "FAIL: consolidate changed the checkpoint it read"; fails=$((fails + 1)); }
expect_ok "consolidate --out beside the checkpoint" \
  "$dtrain" ckpt consolidate "$tmp/zout" --out "$tmp/zout/consolidated.safetensors"

# A run still training holds its directory's lock: consolidate refuses
# until it ends, whether it reads from that directory or writes into it.
copy live base
"$dtrain" train "${common[@]}" --steps 100000000 --save-every 1000000000 --resume \
  --out "$tmp/live" >/dev/null 2>&1 &
bg=$!
for _ in $(seq 100); do
  grep -q "pid $bg " "$tmp/live/.lock" 2>/dev/null && break; sleep 0.1
done
if ! grep -q "pid $bg " "$tmp/live/.lock" 2>/dev/null; then
  echo "FAIL: the training run never took its lock"; fails=$((fails + 1))
else
  expect_error "consolidate from a run still training" \
    "$tmp/live is in use by another dtrain run \(pid $bg on .*\): wait for it to finish" \
    "$dtrain" ckpt consolidate "$tmp/live" --out "$tmp/live.safetensors"
  expect_error "consolidate into a run still training" \
    "$tmp/live is in use by another dtrain run \(pid $bg on .*\): wait for it to finish" \
    "$dtrain" ckpt consolidate "$tmp/base" --out "$tmp/live/w.safetensors"
fi
kill -9 "$bg"; wait "$bg" 2>/dev/null; bg=
[ ! -e "$tmp/live.safetensors" ] && [ ! -e "$tmp/live/w.safetensors" ] ||
  { echo "FAIL: consolidate wrote while the run held its lock"; fails=$((fails + 1)); }
expect_ok "consolidate once the run has ended" \
  "$dtrain" ckpt consolidate "$tmp/live" --out "$tmp/live.safetensors"

# ---- the good run still resumes -------------------------------------------
expect_ok "the unedited run resumes" "${resume[@]}" "$tmp/base"
grep -q "resumed from $tmp/base/ckpt-00000002 at step 2" "$tmp/out" \
  || { echo "FAIL: no resume message"; cat "$tmp/out"; fails=$((fails + 1)); }

[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "all damaged checkpoints and non-finite weights refused with a message"
