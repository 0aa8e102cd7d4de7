#!/usr/bin/env bash
# Shrinking (--min-nproc M with --max-restarts K): a rank of a restarted
# attempt that fails before it says it joined the job (a byte to
# DTRAIN_LAUNCH_JOINED_FD, which dtrain train writes once its communicator
# is up) loses its slot, and the job goes on with one rank fewer, not below
# M; the ranks left are numbered 0.. in slot order, WORLD_SIZE says how
# many, DTRAIN_VIRTUAL_WORLD_SIZE how many the job started with. A rank
# that failed after joining restarts as before, and so does a command that
# never says it joined. DTRAIN_LAUNCH_TEST_LOST_RANK=K makes slot K unable
# to start once the job has restarted. And refused: bad values.
#
# Usage: test_launch_shrink.sh path/to/dtrain
set -euo pipefail
source "$(dirname "$0")/lib.sh"
unset DTRAIN_FAILURE DTRAIN_FAILED_RANK DTRAIN_FAILURE_NS DTRAIN_VIRTUAL_WORLD_SIZE
unset TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS DTRAIN_LAUNCH_TEST_LOST_RANK

# A rank: writes what it saw to $SEEN/R.ATTEMPT, then behaves as $MODE says.
# join: say it joined the job, as dtrain train does.
cat >"$TMP/rank.sh" <<'EOF'
a=$TORCHELASTIC_RESTART_COUNT
{
    echo "WORLD=$WORLD_SIZE"
    echo "LOCAL_WORLD=$LOCAL_WORLD_SIZE"
    echo "LOCAL_RANK=$LOCAL_RANK"
    echo "VIRTUAL=${DTRAIN_VIRTUAL_WORLD_SIZE-unset}"
    echo "FD=${DTRAIN_LAUNCH_JOINED_FD-unset}"
} >"$SEEN/$RANK.$a"
join() {
    [[ $MODE == silent || -z ${DTRAIN_LAUNCH_JOINED_FD-} ]] || echo j >&"$DTRAIN_LAUNCH_JOINED_FD"
}
if [[ $a == 0 ]]; then # rank 1 dies once all have joined
    join
    if [[ $RANK == 1 ]]; then sleep 0.3; kill -9 $$; fi
    exec sleep 30
fi
case $MODE in
hook) join; sleep 0.2; exit 0 ;;        # slot 1 cannot start: the launcher's hook
early) [[ $RANK == 1 ]] && exit 1        # rank 1 fails before joining, every time
       join; exec sleep 30 ;;
late) join                                # rank 1 fails after joining, once
      if [[ $RANK == 1 && $a == 1 ]]; then sleep 0.3; exit 4; fi
      sleep 0.2; exit 0 ;;
silent) [[ $RANK == 1 ]] && exit 1; exec sleep 30 ;;
esac
EOF

run_case() { # name mode launch-args...: sets rc; stderr in $TMP/name.err
    local name=$1 mode=$2
    shift 2
    export SEEN="$TMP/$name" MODE=$mode
    mkdir -p "$SEEN"
    rc=0
    "$DTRAIN" launch "$@" -- bash "$TMP/rank.sh" 2>"$TMP/$name.err" || rc=$?
}
seen() { # name attempt: the ranks that wrote their file in that attempt
    find "$TMP/$1" -type f -name "*.$2" -printf '%f\n' | sed 's/\..*//' | sort -n | tr '\n' ' '
}

check "-n 3 --min-nproc 2, slot 1 killed, then unable to start (DTRAIN_LAUNCH_TEST_LOST_RANK):" \
    "the job goes on with 2 ranks numbered 0 and 1, told it started with 3; exit 0"
DTRAIN_LAUNCH_TEST_LOST_RANK=1 run_case hook hook -n 3 --max-restarts 3 --min-nproc 2
expect_eq "$rc" 0 "exit status"
# (Attempt 1's other ranks may be killed before they write.)
expect_eq "$(seen hook 0)|$(seen hook 2)|$(seen hook 3)" "0 1 2 |0 1 |" "ranks of attempts 0, 2, 3"
expect_contains "$TMP/hook.err" \
    "DTRAIN_LAUNCH_TEST_LOST_RANK=1: rank 1 (slot 1) cannot be started again" "hook line"
expect_contains "$TMP/hook.err" "dtrain launch: the job shrinks from 3 to 2 ranks (of the 3 it \
started with; --min-nproc 2): rank 1 (slot 1) exited with status 1 before it joined the job \
after a restart, so its slot is given up; the global batch is kept: the ranks left compute the \
3 ranks' blocks of each batch, rank 0 computing 2 of them (DTRAIN_VIRTUAL_WORLD_SIZE=3)" \
    "shrink line"
expect_contains "$TMP/hook.err" "dtrain launch: restart 2 of 3: starting the 2 ranks again" \
    "restart line"
for f in 0.0 1.0 2.0; do
    expect_eq "$(field "$TMP/hook/$f" WORLD)" 3 "$f: WORLD_SIZE"
    expect_eq "$(field "$TMP/hook/$f" VIRTUAL)" 3 "$f: DTRAIN_VIRTUAL_WORLD_SIZE"
done
for f in 0.2 1.2; do
    expect_eq "$(field "$TMP/hook/$f" WORLD)" 2 "$f: WORLD_SIZE after shrinking"
    expect_eq "$(field "$TMP/hook/$f" LOCAL_WORLD)" 2 "$f: LOCAL_WORLD_SIZE after shrinking"
    expect_eq "$(field "$TMP/hook/$f" VIRTUAL)" 3 "$f: DTRAIN_VIRTUAL_WORLD_SIZE"
    expect_eq "$(field "$TMP/hook/$f" LOCAL_RANK)" "${f%.*}" "$f: LOCAL_RANK"
done

check "-n 3 --min-nproc 2, rank 1 fails before joining in every restart: one shrink, then the" \
    "next would go below 2: giving up with its status"
run_case early early -n 3 --max-restarts 5 --min-nproc 2 --grace-period 0.3
expect_eq "$rc" 1 "exit status"
expect_contains "$TMP/early.err" "the job shrinks from 3 to 2 ranks" "shrink line"
expect_contains "$TMP/early.err" "dtrain launch: rank 1 exited with status 1 before it joined \
the job after a restart, and the job may not shrink below --min-nproc 2 ranks; giving up" \
    "giving-up line"
expect_eq "$(seen early 0)|$(seen early 2)|$(seen early 3)" "0 1 2 |0 1 |" \
    "ranks of attempts 0, 2, 3"

check "a rank that fails after joining restarts as before: no shrink"
run_case late late -n 3 --max-restarts 3 --min-nproc 2
expect_eq "$rc" 0 "exit status"
expect_eq "$(seen late 2)|$(seen late 3)" "0 1 2 |" "ranks of attempts 2, 3"
if grep -q "shrinks" "$TMP/late.err"; then cat "$TMP/late.err" >&2; fail "late: shrank"; fi

check "a command that never says it joined is never shrunk: restarts until they run out"
run_case silent silent -n 3 --max-restarts 2 --min-nproc 2 --grace-period 0.3
expect_eq "$rc" 1 "exit status"
expect_contains "$TMP/silent.err" "rank 1 failed again after 2 restarts; giving up" "giving up"
if grep -q "shrinks" "$TMP/silent.err"; then cat "$TMP/silent.err" >&2; fail "silent: shrank"; fi

check "--min-nproc N (never below N) and no --min-nproc: no shrinking, nothing in the environment"
for args in "--min-nproc 3" ""; do
    rm -rf "$TMP/none"
    # shellcheck disable=SC2086
    DTRAIN_LAUNCH_TEST_LOST_RANK=1 run_case none hook -n 3 --max-restarts 2 $args \
        --grace-period 0.3
    expect_eq "$rc" 1 "exit status ($args)"
    expect_eq "$(field "$TMP/none/0.0" VIRTUAL)" unset "DTRAIN_VIRTUAL_WORLD_SIZE ($args)"
    expect_eq "$(field "$TMP/none/0.0" FD)" unset "DTRAIN_LAUNCH_JOINED_FD ($args)"
    if grep -q "shrinks" "$TMP/none.err"; then cat "$TMP/none.err" >&2; fail "shrank ($args)"; fi
done

check "bad values are refused with exit 2"
bad "--min-nproc 3 needs --max-restarts K above 0" -n 4 --min-nproc 3
bad "--min-nproc 5 is out of range for -n 4 (valid: 1 to 4)" -n 4 --max-restarts 1 --min-nproc 5
bad "--min-nproc -1 is out of range for -n 4 (valid: 1 to 4)" -n 4 --max-restarts 1 \
    --min-nproc -1
bad "--min-nproc 0 is out of range for -n 2 (valid: 1 to 2)" -n 2 --max-restarts 1 \
    --min_nproc=0
bad "invalid value 'x' for --min-nproc: expected a rank count from 1 to N (-n N)" -n 2 \
    --max-restarts 1 --min-nproc x
bad "--min-nproc works on one host so far, but --nnodes is 2" -n 2 --nnodes 2 \
    --master-addr 10.0.0.1 --max-restarts 1 --min-nproc 1
DTRAIN_LAUNCH_TEST_LOST_RANK=4 bad \
    "invalid value '4' for DTRAIN_LAUNCH_TEST_LOST_RANK: expected an integer from 0 to 3" \
    -n 4 --max-restarts 1 --min-nproc 2
echo "ok"
