#!/usr/bin/env bash
# --tag-output: every line of a rank's stdout / stderr arrives whole on the
# launcher's stdout / stderr with the prefix "[RANK]: ", in order.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

check "3 ranks x 300 lines on stdout and stderr: prefixes, whole lines, order kept"
"$DTRAIN" launch -n 3 --tag-output -- bash -c \
    'for i in $(seq 1 300); do echo "out $RANK $i"; echo "err $RANK $i" >&2; done; printf "tail $RANK"' \
    >"$TMP/out" 2>"$TMP/err"
if grep -vE '^\[([0-2])\]: (out \1 [0-9]+|tail \1)$' "$TMP/out"; then
    fail "malformed stdout lines (above)"
fi
if grep -vE '^\[([0-2])\]: err \1 [0-9]+$' "$TMP/err"; then
    fail "malformed stderr lines (above)"
fi
seq_ok=$(seq 1 300 | tr '\n' ' ')
for r in 0 1 2; do
    expect_eq "$(sed -n "s/^\[$r\]: out $r //p" "$TMP/out" | tr '\n' ' ')" "$seq_ok" "stdout of rank $r"
    expect_eq "$(sed -n "s/^\[$r\]: err $r //p" "$TMP/err" | tr '\n' ' ')" "$seq_ok" "stderr of rank $r"
    expect_contains "$TMP/out" "[$r]: tail $r" "partial last line of rank $r"
done

check "a rank's last words come before the launcher's verdict on it"
rc=0
"$DTRAIN" launch -n 2 --tag-output --grace-period 0.2 -- bash -c \
    'if [[ $RANK == 1 ]]; then echo "boom" >&2; exit 3; fi; exec sleep 60' 2>"$TMP/err2" || rc=$?
expect_eq "$rc" 3 "exit status"
boom=$(grep -n '^\[1\]: boom$' "$TMP/err2" | cut -d: -f1)
verdict=$(grep -n 'rank 1 (pid [0-9]*) exited with status 3' "$TMP/err2" | cut -d: -f1)
[[ -n "$boom" && -n "$verdict" && "$boom" -lt "$verdict" ]] || {
    cat "$TMP/err2" >&2
    fail "the rank's error line should precede the launcher's"
}

check "a line longer than the line buffer still arrives as one prefixed line"
"$DTRAIN" launch -n 1 --tag-output -- bash -c 'head -c 40000 /dev/zero | tr "\0" x; echo' >"$TMP/long"
expect_eq "$(wc -l <"$TMP/long")" 1 "lines"
expect_eq "$(head -c 5 "$TMP/long")" "[0]: " "prefix"
expect_eq "$(tr -d '\n' <"$TMP/long" | wc -c)" 40005 "length"

echo "ok"
