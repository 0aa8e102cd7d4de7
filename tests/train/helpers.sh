# Helpers of the shell tests under tests/train: source it, with $tmp a
# scratch directory and fails=0.

# make_text FILE N SEED: N words drawn from a three-word vocabulary, a
# small corpus that trains in milliseconds.
make_text() {
  /usr/bin/python3 -c '
import random, sys
random.seed(int(sys.argv[3]))
words = ["ab", "cd", "efg"]
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(int(sys.argv[2]))))
' "$1" "$2" "$3"
}

# expect_error NAME PATTERN CMD...: CMD fails with status 1 or 2 (not 0,
# not a signal, not a timeout) and its stderr matches PATTERN (an extended
# regex). A failure is printed and counted in $fails.
expect_error() {
  local name=$1 pattern=$2; shift 2
  timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -eq 0 ] || [ $rc -gt 2 ]; then
    echo "FAIL $name: exit status $rc (want 1 or 2)"; cat "$tmp/err"; fails=$((fails + 1)); return
  fi
  if ! grep -Eq -- "$pattern" "$tmp/err"; then
    echo "FAIL $name: stderr does not match /$pattern/:"; cat "$tmp/err"; fails=$((fails + 1)); return
  fi
  echo "ok   $name: $(grep -E -- "$pattern" "$tmp/err" | head -1)"
}

# expect_ok NAME CMD...: CMD succeeds.
expect_ok() {
  local name=$1; shift
  timeout 120 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL $name: exit status $rc"; cat "$tmp/err"; fails=$((fails + 1)); return
  fi
  echo "ok   $name"
}
