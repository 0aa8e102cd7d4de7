#!/usr/bin/env bash
# A rogue process that knows a running job's address and claims one of its
# ranks, but not its secret: it must be turned away with an authentication
# error (quickly, not after its deadline), and the job must not notice:
# no abort, every all-reduce still right, exit 0.
#
# Usage: fault_secret.sh path/to/dtrain path/to/test_faults [shm|tcp]...
# (the job's transports; both by default)
set -euo pipefail
source "$(dirname "$0")/lib_launch.sh"
fault_args "$@"

ROGUE_TIMEOUT_S=20
ROGUE_LIMIT_MS=5000 # a refusal is one round trip; only a retry loop would take longer

secret_case() { # transport
    local transport=$1 name="secret_$1" port secret r t0 ms rc attempt
    check "$transport: a rogue rank 1 with the wrong DTRAIN_SECRET is refused with an" \
        "authentication error; the 2-rank job finishes unharmed"
    secret=$(random_hex 16)
    # free_port can race with another process taking the port; the job
    # then fails at once in rank 0's bind, and we try another.
    for attempt in 1 2 3; do
        port=$(free_port)
        rm -f "$TMP/$name.stop"
        start_job "$name" DTRAIN_SECRET="$secret" DTRAIN_TIMEOUT=30 DTRAIN_TRANSPORT="$transport" \
            DTRAIN_FAULT_UNTIL="$TMP/$name.stop" -- \
            -n 2 --master-port "$port" -- "$FAULTS" stream 20 20
        local launcher=$JOB_PID
        t0=$(now_ms)
        while ! { has_line "$TMP/$name.out" "^rank 0: stream: " &&
            has_line "$TMP/$name.out" "^rank 1: stream: "; }; do
            alive "$launcher" || break
            (($(now_ms) - t0 < 60000)) || fail "the job did not start streaming within 60 s"
            sleep 0.05
        done
        alive "$launcher" && break
        grep -q "could not serve the store" "$TMP/$name.err" || fail "the job failed to start"
        note "port $port was taken meanwhile; trying another"
        wait_job "$launcher" 10
        [[ $attempt -lt 3 ]] || fail "no usable port after 3 attempts"
    done

    t0=$(now_ms)
    rc=0
    env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
        MASTER_PORT="$port" DTRAIN_SECRET="not-$secret" DTRAIN_TIMEOUT=$ROGUE_TIMEOUT_S \
        DTRAIN_TRANSPORT="$transport" DTRAIN_JOB_ID="rogue$(random_hex 4)" \
        timeout -s KILL $((ROGUE_TIMEOUT_S + 10)) "$FAULTS" join \
        >"$TMP/rogue_$transport.out" 2>"$TMP/rogue_$transport.err" </dev/null || rc=$?
    ms=$(($(now_ms) - t0))
    note "rogue exited with status $rc after $ms ms: $(cat "$TMP/rogue_$transport.err")"
    [[ $rc -eq 3 ]] || fail "the rogue exited with status $rc, expected 3 (refused)"
    grep -q "(authentication failed)" "$TMP/rogue_$transport.out" ||
        fail "dt_comm_init did not return DT_ERR_AUTH: $(cat "$TMP/rogue_$transport.out")"
    grep -qiE "^rank 1: error: .*secret" "$TMP/rogue_$transport.err" ||
        fail "the rogue's error does not say that its secret was refused"
    ((ms < ROGUE_LIMIT_MS)) || fail "the refusal took $ms ms (limit $ROGUE_LIMIT_MS ms)"

    # The job keeps streaming after the refusal; then let it finish.
    local done_before
    done_before=$(grep -c "^rank 0: stream: " "$TMP/$name.out" || true)
    wait_for_lines "$TMP/$name.out" "^rank 0: stream: " $((done_before + 1)) 30 "$launcher"
    touch "$TMP/$name.stop"
    wait_job "$launcher" 30
    note "job exited with status $JOB_RC"
    expect_no_bug_lines "$name"
    [[ $JOB_RC -eq 0 ]] || fail "the job failed after the rogue's attempt (status $JOB_RC)"
    for r in 0 1; do
        grep -qE "^rank $r: stream: finished [0-9]+ all-reduces" "$TMP/$name.out" ||
            fail "rank $r did not finish its stream"
        [[ -z "$(error_lines "$name" $r)" ]] || fail "rank $r printed an error"
    done
    note "$(grep -E "^rank 0: stream: finished" "$TMP/$name.out")"
    expect_no_sanitizer_reports "$name"
    expect_no_leftovers "$name"
}

for transport in "${TRANSPORTS[@]}"; do
    secret_case "$transport"
done

echo "ok"
