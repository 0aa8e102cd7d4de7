# Shared by tests/comm/fault_*.sh and netns_two_hosts.sh: source it after
# `set -euo pipefail`. It starts jobs under `dtrain launch` in the
# background, waits for what they print, and makes sure that whatever
# ends the script (success, a failed check, SIGTERM or SIGINT) no launcher,
# rank or shared-memory file outlives it. SIGKILL cannot be trapped: then
# only the ranks' parent-death signal helps, once the launcher is killed
# too (as ctest does to a test's whole process tree at its TIMEOUT).

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-fault.XXXXXX")
export TMP

# The caller's environment must not leak a secret, a job id, a timeout or
# a transport into the launches under test; each script sets its own.
unset DTRAIN_SECRET DTRAIN_JOB_ID DTRAIN_GRACE_PERIOD DTRAIN_TIMEOUT DTRAIN_TRANSPORT
unset DTRAIN_HEARTBEAT_TIMEOUT DTRAIN_FAULT_PIDDIR MASTER_ADDR MASTER_PORT RANK WORLD_SIZE

LAUNCHERS=()   # pids of launchers, each the leader of its own session
JOB_IDS=()     # DTRAIN_JOB_IDs, to find their /dev/shm files
declare -A JOBID # job name -> its DTRAIN_JOB_ID ("" when the launcher chose)
CLEANUP_HOOKS=()

# A fault script's arguments: dtrain, test_faults, then the transports to
# run with (shm and tcp when none is given).
fault_args() {
    DTRAIN=${1:?usage: $0 path/to/dtrain path/to/test_faults [shm|tcp]...}
    FAULTS=${2:?usage: $0 path/to/dtrain path/to/test_faults [shm|tcp]...}
    shift 2
    TRANSPORTS=("$@")
    [[ ${#TRANSPORTS[@]} -gt 0 ]] || TRANSPORTS=(shm tcp)
}

check() { echo "check: $*"; }
note() { echo "  $*"; }
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
now_ms() { date +%s%3N; }

# A process counts as gone once it has exited, even before it is reaped.
alive() {
    local state
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n "$state" && "$state" != Z ]]
}

# Pids written by test_faults under DTRAIN_FAULT_PIDDIR, only while that
# pid still runs one of our programs (never signal a recycled pid).
job_rank_pids() { # name
    local f pid
    for f in "$TMP/$1.pids"/rank*.pid; do
        [[ -e "$f" ]] || continue
        pid=$(cat "$f")
        if alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q test_; then
            echo "$pid"
        fi
    done
}

cleanup() {
    local rc=$? pid f
    set +e
    for pid in "${LAUNCHERS[@]+"${LAUNCHERS[@]}"}"; do
        # The launcher's session: the launcher itself. Its ranks die with
        # it (parent-death signal), stopped ones included, as SIGKILL needs
        # no SIGCONT; the sweep below catches any that did not.
        kill -KILL -- "-$pid" 2>/dev/null
    done
    for f in "$TMP"/*.pids; do
        [[ -d "$f" ]] || continue
        for pid in $(job_rank_pids "$(basename "$f" .pids)"); do
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
        done
    done
    for hook in "${CLEANUP_HOOKS[@]+"${CLEANUP_HOOKS[@]}"}"; do "$hook"; done
    for id in "${JOB_IDS[@]+"${JOB_IDS[@]}"}"; do rm -f /dev/shm/dtrain-"$id"-*; done
    if [[ $rc -ne 0 && $rc -ne 77 ]]; then
        # The outputs are the evidence: show them before they go. Progress
        # lines are many and alike, so only the last few of stdout.
        for f in "$TMP"/*.err "$TMP"/*.out; do
            [[ -s "$f" ]] || continue
            echo "--- $(basename "$f"):" >&2
            case $f in
            *.out) tail -n 6 "$f" >&2 ;;
            *) tail -n 40 "$f" >&2 ;;
            esac
        done
    fi
    if [[ -n "${KEEP_TMP:-}" ]]; then
        echo "outputs kept in $TMP" >&2
    else
        rm -rf "$TMP"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

random_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

source "$(dirname "${BASH_SOURCE[0]}")/../free_port.sh"

# start_job NAME [ENV=VALUE ...] -- LAUNCH-ARGS...
# Starts `dtrain launch LAUNCH-ARGS` in the background in its own session,
# with stdout in $TMP/NAME.out, stderr in $TMP/NAME.err and the ranks'
# pids in $TMP/NAME.pids/. Sets JOB_PID and JOB_T0 (ms).
# LAUNCH_WRAP (an array), when set, goes before `dtrain launch`: a command
# that ends by exec'ing its arguments, so that JOB_PID is the launcher.
# A fresh DTRAIN_JOB_ID keeps concurrent runs apart in /dev/shm, unless
# JOB_ID_FROM_LAUNCHER=1 leaves the choice to the launcher.
start_job() {
    local name=$1
    shift
    local envs=()
    while [[ $# -gt 0 && "$1" != "--" ]]; do
        envs+=("$1")
        shift
    done
    [[ "${1:-}" == "--" ]] && shift
    local id
    id="ft$(random_hex 8)"
    if [[ "${JOB_ID_FROM_LAUNCHER:-0}" == 1 ]]; then
        id=""
    else
        JOB_IDS+=("$id")
        envs=("DTRAIN_JOB_ID=$id" "${envs[@]+"${envs[@]}"}")
    fi
    mkdir -p "$TMP/$name.pids"
    JOB_T0=$(now_ms)
    env DTRAIN_FAULT_PIDDIR="$TMP/$name.pids" "${envs[@]+"${envs[@]}"}" \
        setsid "${LAUNCH_WRAP[@]+"${LAUNCH_WRAP[@]}"}" "$DTRAIN" launch "$@" \
        >"$TMP/$name.out" 2>"$TMP/$name.err" </dev/null &
    JOB_PID=$!
    LAUNCHERS+=("$JOB_PID")
    JOBID[$name]=$id
}

# wait_job PID SECONDS: waits for the launcher to exit, at most SECONDS;
# sets JOB_RC. A launcher still running then is a hang: fail.
wait_job() {
    local pid=$1 limit_ms=$(($2 * 1000)) t0
    t0=$(now_ms)
    while alive "$pid"; do
        (($(now_ms) - t0 < limit_ms)) || fail "the launcher (pid $pid) still runs after $2 s: a hang"
        sleep 0.05
    done
    JOB_RC=0
    wait "$pid" || JOB_RC=$?
    # Reaped: its pid may be recycled now, so cleanup must not signal it.
    local keep=() p
    for p in "${LAUNCHERS[@]+"${LAUNCHERS[@]}"}"; do [[ $p == "$pid" ]] || keep+=("$p"); done
    LAUNCHERS=("${keep[@]+"${keep[@]}"}")
}

# wait_for_lines FILE REGEX N SECONDS [PID]: until FILE has N lines
# matching; with PID, fails as soon as that process is gone without them.
wait_for_lines() {
    local file=$1 re=$2 n=$3 limit_ms=$(($4 * 1000)) pid=${5:-} t0 have gone=0
    t0=$(now_ms)
    while :; do
        have=$(grep -cE -- "$re" "$file" 2>/dev/null || true)
        [[ ${have:-0} -ge $n ]] && return 0
        # One more look after the process is gone: it may have printed
        # the lines just before it exited.
        ((gone)) && fail "pid $pid exited; $(basename "$file") has ${have:-0} of $n lines matching '$re'"
        [[ -n "$pid" ]] && ! alive "$pid" && gone=1 && continue
        (($(now_ms) - t0 < limit_ms)) ||
            fail "after $4 s, $(basename "$file") has ${have:-0} of $n lines matching '$re'"
        sleep 0.05
    done
}

has_line() { grep -qE -- "$2" "$1" 2>/dev/null; } # file regex

# rank_pid NAME RANK: the pid that rank wrote (waits up to 20 s for it).
rank_pid() {
    local f="$TMP/$1.pids/rank$2.pid"
    for _ in $(seq 1 400); do
        [[ -s "$f" ]] && { cat "$f"; return 0; }
        sleep 0.05
    done
    fail "rank $2 of job $1 never wrote its pid"
}

# After the launcher exited: no rank of the job may still run (the kernel
# gets 2 s to finish SIGKILLs), and its shared-memory files are gone.
expect_no_leftovers() { # name
    local left id=""
    for _ in $(seq 1 40); do
        left=$(job_rank_pids "$1" | tr '\n' ' ')
        [[ -z "$left" ]] && break
        sleep 0.05
    done
    [[ -z "$left" ]] || fail "job $1: ranks still alive after the launcher exited: $left"
    id=${JOBID[$1]:-}
    [[ -n "$id" ]] || return 0
    if compgen -G "/dev/shm/dtrain-$id-*" >/dev/null; then
        fail "job $1: shared-memory files left behind: $(ls /dev/shm/dtrain-"$id"-*)"
    fi
}

# Lines `rank R: error: ...` that rank R printed on stderr.
error_lines() { grep -E "^rank $2: error: " "$TMP/$1.err" || true; }

# expect_error_line NAME RANK REGEX WHAT: rank RANK printed exactly one
# error line, and it matches REGEX (extended, case-sensitive).
expect_error_line() {
    local lines n
    lines=$(error_lines "$1" "$2")
    n=$(printf '%s' "$lines" | grep -c . || true)
    [[ $n -eq 1 ]] || fail "job $1: rank $2 printed $n error lines, expected exactly 1"
    grep -qE -- "$3" <<<"$lines" || fail "job $1: rank $2's error does not name $4: $lines"
    note "rank $2: ${lines#"rank $2: error: "}"
}

# A sanitizer build reports on stderr; any report fails the test even when
# the exit statuses look right.
expect_no_sanitizer_reports() { # name
    if grep -qE "ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|runtime error:" \
        "$TMP/$1.out" "$TMP/$1.err"; then
        fail "job $1: sanitizer report in the output"
    fi
}

# No rank may print a wrong result or a FAIL of its own.
expect_no_bug_lines() { # name
    if grep -qE "^rank [0-9]+: FAIL" "$TMP/$1.out" "$TMP/$1.err"; then
        fail "job $1: $(grep -hE "^rank [0-9]+: FAIL" "$TMP/$1.err" | head -3)"
    fi
}

# Start NP ranks of `test_faults stream` (far more iterations than can run:
# the fault under test ends it) and return once every rank is streaming, so
# that the fault hits the stream and not init. Sets JOB_PID. Needs NP,
# TIMEOUT_S and FAULTS. Usage:
#   start_stream_job name transport [ENV=VALUE ...] [-- LAUNCH-OPTION ...]
start_stream_job() {
    local name=$1 transport=$2 r envs=()
    shift 2
    while [[ $# -gt 0 && "$1" != "--" ]]; do
        envs+=("$1")
        shift
    done
    [[ "${1:-}" == "--" ]] && shift
    start_job "$name" DTRAIN_TIMEOUT=$TIMEOUT_S DTRAIN_TRANSPORT="$transport" \
        "${envs[@]+"${envs[@]}"}" -- -n $NP "$@" -- "$FAULTS" stream 10000000 20
    for ((r = 0; r < NP; r++)); do
        wait_for_lines "$TMP/$name.out" "^rank $r: stream: " 1 60 "$JOB_PID"
    done
}
