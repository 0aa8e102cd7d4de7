# Shared by the tests/cli scripts: source it after `set -euo pipefail`.
# The first argument of the script is the dtrain binary.

DTRAIN=${1:?usage: $0 path/to/dtrain}
[[ -x "$DTRAIN" ]] || { echo "FAIL: $DTRAIN is not an executable" >&2; exit 1; }

# The caller's environment must not leak a secret, a job id or a grace
# period into the launches under test.
unset DTRAIN_SECRET DTRAIN_JOB_ID DTRAIN_GRACE_PERIOD

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export TMP

check() { echo "check: $*"; }
fail() {
    echo "FAIL: $*" >&2
    exit 1
}
expect_eq() { # actual expected what
    [[ "$1" == "$2" ]] || fail "$3: expected '$2', got '$1'"
}
expect_contains() { # file text what
    grep -qF -- "$2" "$1" || {
        echo "--- $1:" >&2
        cat "$1" >&2
        fail "$3: no '$2' in the output"
    }
}
now_ms() { date +%s%3N; }

# A process counts as gone once it has exited, even if nobody has reaped
# it yet (a zombie under a PID 1 that does not reap).
alive() {
    local state
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n "$state" && "$state" != Z ]]
}

# Every pid written to $TMP/*.pid must be gone (waits up to 2 s for the
# kernel to finish killing them).
expect_no_survivors() {
    local f pid left
    for _ in $(seq 1 20); do
        left=""
        for f in "$TMP"/*.pid; do
            [[ -e "$f" ]] || continue
            pid=$(cat "$f")
            if alive "$pid"; then left="$left $pid"; fi
        done
        [[ -z "$left" ]] && return 0
        sleep 0.1
    done
    fail "processes still alive after the launcher exited:$left"
}

# Waits until n files match $TMP/*.pid (the ranks have started).
wait_for_pids() {
    local n=$1
    for _ in $(seq 1 100); do
        local count
        count=$(find "$TMP" -maxdepth 1 -name '*.pid' | wc -l)
        [[ "$count" -ge "$n" ]] && return 0
        sleep 0.05
    done
    fail "only $(find "$TMP" -maxdepth 1 -name '*.pid' | wc -l) of $n processes started"
}

# A rank body that records its pid and the pid of a child it starts, then
# waits on the child: the child shows whether the launcher reaches a rank's
# whole process group, not just the rank.
RANK_WITH_CHILD='echo $$ > "$TMP/rank$RANK.pid"; sleep 60 & echo $! > "$TMP/child$RANK.pid"; wait'

# `dtrain launch ARGS -- true` must exit 2 with want in its message.
bad() { # expected-text args...
    local want=$1
    shift
    rc=0
    "$DTRAIN" launch "$@" -- true 2>"$TMP/bad.err" || rc=$?
    expect_eq "$rc" 2 "exit status of launch $*"
    expect_contains "$TMP/bad.err" "$want" "message of launch $*"
}

# The restart tests' ranks write what they saw to DIR/RANK.ATTEMPT as
# NAME=value lines.
field() { # file name: the value
    sed -n "s/^$2=//p" "$1"
}
attempts() { # dir: the attempts seen, one per line
    find "$1" -name '[0-9]*.[0-9]*' ! -name '*.tmp' -printf '%f\n' | sed 's/.*\.//' | sort -un
}
