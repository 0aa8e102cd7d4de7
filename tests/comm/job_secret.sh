#!/usr/bin/env bash
# What keeps other users of a machine out of a job:
#  - a job on one host listens only on the loopback, for its store and (with
#    DTRAIN_TRANSPORT=tcp) its links: no rank has a listening socket on any
#    other address, and the store's port cannot be reached through the
#    host's other addresses;
#  - `dtrain launch` hands each job a random secret of its own through the
#    environment, never the command line (which every user can read);
#  - a job started by another launcher without DTRAIN_SECRET runs on a
#    secret anyone could guess: rank 0 warns once, saying how to set one,
#    and no warning comes when DTRAIN_SECRET is set or under dtrain launch.
#
# Usage: job_secret.sh path/to/dtrain path/to/test_faults
set -euo pipefail
DTRAIN=${1:?usage: $0 path/to/dtrain path/to/test_faults}
FAULTS=${2:?usage: $0 path/to/dtrain path/to/test_faults}
source "$(dirname "$0")/lib_launch.sh"

WARNING="runs on a secret that others can guess"

# The host's addresses other than the loopback.
other_addrs() {
    ip -o addr show 2>/dev/null | awk '{print $4}' | cut -d/ -f1 |
        grep -vE '^(127\.|::1$)' | grep -v '^fe80' || true
}

# Local addresses of the listening TCP sockets of process PID.
listen_addrs() {
    ss -Htlnp 2>/dev/null | grep -F "pid=$1," | awk '{print $4}'
}

is_loopback() { # ADDR:PORT as ss prints it
    [[ "$1" =~ ^127\. || "$1" =~ ^\[::1\]: || "$1" =~ ^\[::ffff:127\. ]]
}

bind_case() { # transport
    local transport=$1 name="bind_$1" port r pid a addr
    check "$transport: a one-host job listens on the loopback only"
    rm -f "$TMP/$name.stop"
    start_job "$name" DTRAIN_TIMEOUT=30 DTRAIN_TRANSPORT="$transport" \
        DTRAIN_FAULT_UNTIL="$TMP/$name.stop" -- -n 2 -- "$FAULTS" stream 20 20
    for r in 0 1; do wait_for_lines "$TMP/$name.out" "^rank $r: stream: " 1 60 "$JOB_PID"; done
    # The port the launcher chose for the store, as the ranks were told.
    port=$(tr '\0' '\n' <"/proc/$(rank_pid "$name" 1)/environ" | sed -n 's/^MASTER_PORT=//p')
    [[ -n "$port" ]] || fail "no MASTER_PORT in rank 1's environment"
    local seen=0
    for r in 0 1; do
        pid=$(rank_pid "$name" $r)
        for a in $(listen_addrs "$pid"); do
            seen=$((seen + 1))
            note "rank $r listens on $a"
            is_loopback "$a" || fail "rank $r listens on $a, not on the loopback"
        done
    done
    ((seen > 0)) || fail "no listening socket of the job found (is ss working?)"
    for addr in $(other_addrs); do
        if timeout 5 bash -c "exec 3<>/dev/tcp/$addr/$port" 2>/dev/null; then
            fail "the store's port $port answers on $addr"
        fi
        note "the store's port $port does not answer on $addr"
    done
    # The secret reached the ranks through their environment, not argv.
    pid=$(rank_pid "$name" 1)
    local secret
    secret=$(tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^DTRAIN_SECRET=//p')
    [[ ${#secret} -ge 32 ]] || fail "rank 1 has no random DTRAIN_SECRET in its environment"
    if tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$secret"; then
        fail "the secret is on rank 1's command line"
    fi
    echo "$secret" >>"$TMP/secrets"
    touch "$TMP/$name.stop"
    wait_job "$JOB_PID" 30
    [[ $JOB_RC -eq 0 ]] || fail "the job failed (status $JOB_RC)"
    if grep -qF "$WARNING" "$TMP/$name.err"; then fail "a warning under dtrain launch"; fi
    expect_no_leftovers "$name"
}

# Two ranks started by hand with torchrun's variables, as torchrun would.
# Prints how many warning lines rank 0 and rank 1 printed.
by_hand() { # name [ENV=VALUE...]
    local name=$1 port r id attempt rc
    shift
    # free_port can race with another process taking the port; rank 0 then
    # fails at once in its bind, and we try another.
    for attempt in 1 2 3; do
        port=$(free_port)
        id="h$(random_hex 6)"
        local pids=()
        for r in 0 1; do
            env "$@" RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
                MASTER_PORT="$port" DTRAIN_TIMEOUT=10 DTRAIN_JOB_ID="$id" \
                timeout -s KILL 60 "$FAULTS" join >"$TMP/$name.$r.out" 2>"$TMP/$name.$r.err" \
                </dev/null &
            pids+=($!)
        done
        rc=0
        for r in 0 1; do wait "${pids[$r]}" || rc=$?; done
        [[ $rc -ne 0 ]] && grep -q "could not serve the store" "$TMP/$name.0.err" && continue
        [[ $rc -eq 0 ]] || fail "$name: a rank failed: $(cat "$TMP/$name".*.err)"
        echo "$(grep -cF "$WARNING" "$TMP/$name.0.err" || true)" \
            "$(grep -cF "$WARNING" "$TMP/$name.1.err" || true)"
        return 0
    done
    fail "$name: no usable port after 3 attempts"
}

bind_case shm
bind_case tcp
[[ $(sort -u "$TMP/secrets" | wc -l) -eq 2 ]] || fail "two launches got the same secret"
note "each launch drew a secret of its own"

check "without DTRAIN_SECRET (torchrun's variables only): rank 0 warns once"
counts=$(by_hand nosecret)
[[ "$counts" == "1 0" ]] || fail "warning lines on ranks 0 and 1: $counts, expected 1 and 0"
note "$(grep -F "$WARNING" "$TMP/nosecret.0.err")"
grep -F "$WARNING" "$TMP/nosecret.0.err" | grep -q "export DTRAIN_SECRET=" ||
    fail "the warning does not say how to set a secret"

check "a store port that another process listens on: the launcher refuses it before any rank" \
    "starts, and a rank 0 started by hand fails at once; both name the port and the command" \
    "that shows whose it is"
port=$(free_port)
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); time.sleep(30)' \
    "$port" &
squatter=$!
for _ in $(seq 1 100); do ss -Htln "sport = :$port" | grep -q . && break; sleep 0.05; done
rc=0
DTRAIN_TIMEOUT=5 timeout 30 "$DTRAIN" launch -n 2 --master-port "$port" -- "$FAULTS" join \
    >"$TMP/taken.out" 2>"$TMP/taken.err" || rc=$?
[[ $rc -eq 1 && ! -s "$TMP/taken.out" ]] ||
    fail "the launcher's status $rc (expected 1), and a rank ran: $(cat "$TMP/taken.out")"
grep -F "dtrain launch: the job's store cannot have port $port" "$TMP/taken.err" |
    grep -qF "ss -ltnp 'sport = :$port'" ||
    fail "the launcher's error does not name the port and the command: $(cat "$TMP/taken.err")"
note "$(cat "$TMP/taken.err")"
rc=0
env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT="$port" DTRAIN_SECRET=s DTRAIN_TIMEOUT=5 timeout 30 "$FAULTS" join \
    >"$TMP/taken0.out" 2>"$TMP/taken0.err" </dev/null || rc=$?
kill "$squatter" 2>/dev/null || true
wait "$squatter" 2>/dev/null || true
[[ $rc -ne 0 ]] || fail "rank 0 ran on a port another process listens on"
grep -F "rank 0: error" "$TMP/taken0.err" | grep -F "port $port (MASTER_PORT)" |
    grep -qF "ss -ltnp 'sport = :$port'" ||
    fail "rank 0's error does not name the port and the command: $(cat "$TMP/taken0.err")"
note "$(grep -F "rank 0: error" "$TMP/taken0.err")"

check "with DTRAIN_SECRET: no warning"
counts=$(by_hand secret DTRAIN_SECRET="$(random_hex 16)")
[[ "$counts" == "0 0" ]] || fail "warning lines on ranks 0 and 1: $counts, expected none"
echo "ok"
