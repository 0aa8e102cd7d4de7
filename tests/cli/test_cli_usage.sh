#!/usr/bin/env bash
# The command line: subcommand dispatch, help, version, and launch flags
# that are wrong, each refused with exit 2 and a message naming the flag
# and the value; train's --nproc, listed in its --help and bounded as the
# launcher's -n is.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# expect_usage_error "text the message must contain" ARGS... (after `dtrain`)
expect_usage_error() {
    local want=$1
    shift
    local rc=0
    "$DTRAIN" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    expect_eq "$rc" 2 "exit status of 'dtrain $*'"
    expect_contains "$TMP/err" "$want" "message of 'dtrain $*'"
}

check "dispatch: no command, unknown command -> exit 2 with usage"
expect_usage_error "usage: dtrain <command>"
expect_usage_error "unknown command 'frobnicate'" frobnicate

check "--version, help, launch --help"
"$DTRAIN" --version | grep -qE '^dtrain [0-9]' || fail "--version"
"$DTRAIN" help | grep -q "launch" || fail "help lists launch"
"$DTRAIN" launch --help >"$TMP/help"
expect_contains "$TMP/help" "usage: dtrain launch" "launch --help"
expect_contains "$TMP/help" "examples:" "launch --help"
"$DTRAIN" help launch | cmp -s - "$TMP/help" || fail "'help launch' differs from 'launch --help'"

check "bad values name the flag and the value"
expect_usage_error "invalid value '0' for -n" launch -n 0 -- true
expect_usage_error "invalid value 'abc' for --nproc-per-node" launch --nproc-per-node=abc -- true
expect_usage_error "invalid value '4x' for --nproc_per_node" launch --nproc_per_node 4x -- true
expect_usage_error "invalid value '0' for --nnodes" launch --nnodes 0 -- true
expect_usage_error "invalid value '1:4' for --nnodes" launch --nnodes 1:4 -- true
expect_usage_error "invalid value '-1' for --node_rank" launch --node_rank=-1 -- true
expect_usage_error "--node-rank 2 is out of range for --nnodes 2" \
    launch --nnodes 2 --node-rank 2 --master-addr h0 -- true
expect_usage_error "invalid value '0' for --master-port" launch --master-port 0 -- true
expect_usage_error "invalid value '65536' for --master_port" launch --master_port=65536 -- true
expect_usage_error "invalid value '-1' for --grace-period" launch --grace-period -1 -- true
DTRAIN_GRACE_PERIOD=soon expect_usage_error "invalid value 'soon' for DTRAIN_GRACE_PERIOD" \
    launch -- true

check "unknown flags, missing values, missing command, inconsistent flags"
expect_usage_error "unknown option '--bogus'" launch --bogus -- true
expect_usage_error "option -n needs a value" launch -n
expect_usage_error "option --tag-output takes no value" launch --tag-output=yes -- true
expect_usage_error "no command to run" launch -n 2
expect_usage_error "no command to run" launch -n 2 --
expect_usage_error "--nnodes 2 needs --master-addr" launch --nnodes 2 -- true
expect_usage_error "--standalone means one host" launch --standalone --nnodes 2 -- true
DTRAIN_JOB_ID=../etc expect_usage_error "DTRAIN_JOB_ID='../etc' is not valid" launch -- true

check "train --nproc: in --help, with the launcher's own bound for -n"
# The launcher's bound, as its own refusal states it: the reference.
"$DTRAIN" launch -n 0 -- true 2>"$TMP/err" || true
max=$(sed -nE "s/.*expected an integer from 1 to ([0-9]+).*/\1/p" "$TMP/err")
[[ -n "$max" ]] || fail "no bound in the launcher's refusal: $(cat "$TMP/err")"
"$DTRAIN" train --help >"$TMP/help"
grep -E -- "^  --nproc N " "$TMP/help" >"$TMP/nproc" || fail "train --help does not list --nproc"
expect_contains "$TMP/nproc" "(1 to $max)" "train --help's --nproc line"
# Not under a launcher: more ranks than the launcher starts are refused by
# train itself, naming --nproc and the bound, not by the launcher's -n.
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE
expect_usage_error "--nproc" train --nproc $((max + 1)) --steps 1
expect_contains "$TMP/err" "at most $max" "train --nproc $((max + 1))"
expect_usage_error "--nproc needs a rank count" train --nproc 0 --steps 1
expect_contains "$TMP/err" "not '0'" "train --nproc 0"
# A dry run plans a job of any size, several hosts' ranks included.
"$DTRAIN" train --dry-run --model gpt2 --zero-stage 3 --nproc $((4 * max + 1)) >"$TMP/out" ||
    fail "train --dry-run --nproc $((4 * max + 1)) was refused"
expect_contains "$TMP/out" "N = $((4 * max + 1)) data-parallel ranks" "the dry run's rank count"

check "flags after the command belong to the command"
out=$("$DTRAIN" launch -n 1 echo -n --bogus)
expect_eq "$out" "--bogus" "the command's own flags"

echo "ok"
