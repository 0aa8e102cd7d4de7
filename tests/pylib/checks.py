"""The Python tests' check: print ok/FAIL per assertion, keep going, and
fail the process at the end if any check failed."""
import sys

failures = []


def check(cond, msg):
    print(("ok    " if cond else "FAIL  ") + msg, flush=True)
    if not cond:
        failures.append(msg)


def finish():
    if failures:
        sys.exit("%d check(s) failed" % len(failures))
