#!/usr/bin/env bash
# What the trainer must do with the checks of checkpoint, weights and
# metrics: one run per --out (dt_ckpt_lock), a failed --log-json write
# stops the run (dt_log_json_step's errno), and an update that makes the
# weights non-finite stops the run at that step (dt_weights_check_finite),
# under ZeRO-3 too (each rank's pieces).
#   test_defects_wired.sh DTRAIN
set -uo pipefail
dtrain=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
. "$here/helpers.sh"

make_text "$tmp/data.txt" 20000 3
common=(--data "$tmp/data.txt" --n-layer 1 --n-head 2 --n-embd 16 --block-size 16
        --batch-size 2 --threads 1 --eval-batches 0)

# 1. Two runs on one --out: the second fails at once, naming the directory
#    and the first (before: both ran, deleting each other's temporary
#    directories and pruning each other's checkpoints).
"$dtrain" train "${common[@]}" --steps 1000000 --save-every 1 --out "$tmp/run" \
  --log-json "$tmp/a.json" >/dev/null 2>"$tmp/a.err" &
pid=$!
logged() { cat "$tmp/a.json" 2>/dev/null | grep -c '"loss"'; }
for _ in $(seq 600); do
  [ "$(logged)" -ge 2 ] && break
  sleep 0.05
done
[ "$(logged)" -ge 2 ] || { echo "FAIL: the first run did not start"; cat "$tmp/a.err"; exit 1; }
expect_error "a second run on the same --out" \
  "$tmp/run is in use by another dtrain run \(pid $pid on " \
  "$dtrain" train "${common[@]}" --steps 1000000 --save-every 1 --out "$tmp/run" --resume
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[ $rc -eq 130 ] || { echo "FAIL: the first run exited $rc, want 130"; cat "$tmp/a.err"; fails=$((fails + 1)); }
expect_ok "the directory is free once the first run ended" \
  "$dtrain" train "${common[@]}" --steps 1 --out "$tmp/run2"

# 2. --log-json on a full disk: an error at the first line, not exit 0.
expect_error "--log-json on a full disk" \
  "--log-json /dev/full: write failed: No space left on device" \
  "$dtrain" train "${common[@]}" --steps 3 --log-json /dev/full

# 3. An update that makes the weights non-finite stops the run at that
#    step, naming the tensor (before: step 2 failed on a NaN gradient).
expect_error "non-finite weights after the update" \
  "step 1: the update made the weights non-finite: tensor [a-z0-9_.]+ holds (nan|-?inf)" \
  "$dtrain" train "${common[@]}" --steps 3 --lr 1e300

# 4. The same under ZeRO-3 at 2 ranks: the model keeps no parameters
#    between uses, so each rank checks its own pieces (trainer.c
#    updated_finite), naming the tensor and its element in the whole model.
expect_error "non-finite pieces after a ZeRO-3 update" \
  "step 1: the update made the weights non-finite: tensor [a-z0-9_.]+ holds (nan|-?inf) at element [0-9]+" \
  "$dtrain" train "${common[@]}" --steps 3 --lr 1e300 --nproc 2 --zero-stage 3 --threads 1

[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "ok: the trainer locks --out, stops on a failed --log-json write and on non-finite weights"
