"""A step's communication waits across ranks: the exposed communication
(the least any rank waited) apart from the wait for a straggler.

  test_step_waits.py DTRAIN

DDP at 2 ranks on GPT-2's shapes (vocabulary 50257, C 768, 12 heads, one
layer; batch 2 x 64), 3 steps, with one rank made a straggler by
DTRAIN_TEST_SLOW=backward:400:R: it sleeps 400 ms in every step's backward
(about 3x a step's compute here, so that a busy machine's noise between
the ranks' compute cannot reorder them).
Every rank prints its own step lines (--log-ranks all), each with its own
wait and the job's view. Checked against what the test knows independently:
- the rank that waited least is the one slowed, named on every line of
  both ranks after the first (slowed rank 1, then rank 0, so that neither
  answer is fixed; the first step's first touches of memory can cost a
  rank more than the sleep on a VM that shadows the page tables);
- the other rank waited at least half the sleep each step after the
  first, and on every line the exposed figure is the smaller of the two ranks' printed waits (computed
  here from both ranks' own lines), the same on both ranks' lines;
- rank 0's JSON log carries the same: comm_ms its own wait,
  comm_exposed_ms the least, comm_wait_max_ms the most, slowest_rank;
- --profile splits "communication waited on" into the exposed part and
  the part behind the slower rank, which add up to it;
- the line at the end of the run gives the means of the steps after the
  first (computed here from the step lines) and the slowed rank as the
  slowest in every one of them;
- a malformed DTRAIN_TEST_SLOW is refused by name, not ignored.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import run  # noqa: E402

SLEEP_MS = 400
STEPS = 4  # the first step's waits are timing: three after it are checked
LINE = re.compile(r"^step (\d+)/\d+ .*\| comm ([\d.]+) ms exposed \(rank (\d) waited ([\d.]+), "
                  r"slowest rank (\d)\)", re.M)


def base(log):
    return ["train", "--model", "gpt2", "--n-layer", "1", "--batch-size", "2", "--seq-len", "64",
            "--threads", "1", "--eval-batches", "0", "--nproc", "2", "--steps", str(STEPS),
            "--log-ranks", "all", "--log-json", log]


def lines_by_step(out):
    """{step: {rank: (exposed, waited, slowest)}} from every rank's lines."""
    steps = {}
    for m in LINE.finditer(out):
        step, exposed, rank, waited, slowest = m.groups()
        steps.setdefault(int(step), {})[int(rank)] = (float(exposed), float(waited), int(slowest))
    return steps


def straggler(dtrain, slow, tmp, profile):
    log = os.path.join(tmp, "waits-%d.json" % slow)
    args = base(log) + (["--profile"] if profile else [])
    # The fixed product paths: on a fresh cache, timing them in step 1
    # would add a second or so to one rank's compute and not the other's.
    r = run(dtrain, args, {"DTRAIN_TEST_SLOW": "backward:%d:%d" % (SLEEP_MS, slow),
                           "DTRAIN_MATMUL_PATHS": "rule"})
    check(r.returncode == 0, "rank %d slowed: the run ends (exit %d) %s"
          % (slow, r.returncode, r.stderr[-400:]))
    steps = lines_by_step(r.stdout)
    check(sorted(steps) == list(range(1, STEPS + 1)) and
          all(sorted(v) == [0, 1] for v in steps.values()),
          "rank %d slowed: both ranks print every step's waits (%s)" % (slow, sorted(steps)))
    other = 1 - slow
    for step, v in sorted(steps.items()):
        if sorted(v) != [0, 1]:
            continue
        least = min(v[0][1], v[1][1])
        check(abs(v[0][0] - least) <= 0.051 and abs(v[1][0] - least) <= 0.051,
              "step %d: exposed %.1f / %.1f ms on the two ranks' lines = the least of their "
              "waits, %.1f" % (step, v[0][0], v[1][0], least))
        if step == 1:
            # The first step's compute differs between the ranks by more
            # than the sleep on some machines (first touches of memory on
            # a VM that shadows the page tables): who waits is timing.
            continue
        check(v[0][2] == slow and v[1][2] == slow,
              "step %d: both ranks name the slowed rank %d as the slowest (%d, %d)"
              % (step, slow, v[0][2], v[1][2]))
        check(v[other][1] >= SLEEP_MS / 2,
              "step %d: rank %d waited %.1f ms for the slowed rank (at least %d)"
              % (step, other, v[other][1], SLEEP_MS // 2))
    entries = [json.loads(l) for l in open(log) if '"loss"' in l] if os.path.exists(log) else []
    ok = len(entries) == STEPS
    for e in entries:
        v = steps.get(e["step"] + 1, {})
        if sorted(v) != [0, 1]:
            ok = False
            continue
        waits = (v[0][1], v[1][1])
        ok &= (abs(e["comm_ms"] - waits[0]) <= 0.051 and
               abs(e["comm_exposed_ms"] - min(waits)) <= 0.051 and
               abs(e["comm_wait_max_ms"] - max(waits)) <= 0.051 and
               e["slowest_rank"] == (slow if e["step"] > 0 else v[0][2]))
    check(ok, "rank %d slowed: rank 0's --log-json steps carry its wait, the least, the most and "
          "slowest_rank %d, as the two ranks printed them" % (slow, slow))
    summary_check(r.stdout, steps, slow)
    return r.stdout


def summary_check(out, steps, slow):
    """Each rank's line at the end against the means of its step lines
    after the first."""
    later = [steps[k] for k in sorted(steps) if k > 1 and sorted(steps[k]) == [0, 1]]
    n = len(later)
    for rank in (0, 1):
        m = re.search(r"^communication waits, the mean of (\d+) steps after the first: ([\d.]+) ms "
                      r"exposed \([\d.]+%% of the step\); rank %d waited ([\d.]+) ms \([\d.]+%%\), "
                      r"the rest of it behind slower ranks; the slowest rank most often: rank "
                      r"(\d+), in (\d+) of (\d+) steps$" % rank, out, re.M)
        want_exposed = sum(v[rank][0] for v in later) / n if n else -1
        want_mine = sum(v[rank][1] for v in later) / n if n else -1
        # Each step line rounds to 0.1 ms and so does the mean of the exact
        # waits: the two means differ by up to 0.05 + 0.05.
        check(m is not None and int(m.group(1)) == n == STEPS - 1 and
              abs(float(m.group(2)) - want_exposed) <= 0.101 and
              abs(float(m.group(3)) - want_mine) <= 0.101 and
              m.group(4, 5, 6) == (str(slow), str(n), str(n)),
              "rank %d slowed: rank %d's line at the end: %d steps, exposed %.2f and waited %.2f "
              "ms a step, rank %d the slowest in all (%s)"
              % (slow, rank, n, want_exposed, want_mine, slow, m.group(0) if m else "no line"))


def profile_split(out):
    rows = {m.group(1).strip(): float(m.group(2)) for m in
            re.finditer(r"^ {2,4}(\S.*?)\s{2,}([\d.]+)\s+[\d.]+%", out, re.M)}
    waited, exposed, behind = (rows.get(k) for k in ("communication waited on", "exposed",
                                                     "behind slower ranks"))
    check(None not in (waited, exposed, behind) and abs(exposed + behind - waited) <= 0.02,
          "--profile: exposed %s + behind slower ranks %s = communication waited on %s"
          % (exposed, behind, waited))
    check(behind is not None and behind >= SLEEP_MS / 2,
          "--profile: rank 0's wait behind the slowed rank, %s ms a step, is most of the "
          "sleep" % behind)


def main():
    dtrain = sys.argv[1]
    tmp = os.environ.get("TMPDIR", "/tmp")
    out = straggler(dtrain, 1, tmp, True)
    profile_split(out)
    straggler(dtrain, 0, tmp, False)
    r = run(dtrain, ["train", "--model", "tiny", "--steps", "1"],
            {"DTRAIN_TEST_SLOW": "save:10:0"})
    check(r.returncode == 2 and "DTRAIN_TEST_SLOW='save:10:0'" in r.stderr and
          "inside a step" in r.stderr,
          "a point outside a step is refused by name (exit %d: %s)"
          % (r.returncode, r.stderr.strip()[-200:]))
    return finish()


if __name__ == "__main__":
    main()
