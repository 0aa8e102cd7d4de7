"""--trace through a failure: a 2-rank run of the tiny model under
`--max-restarts 1` whose rank 1 is killed with SIGKILL once 6 steps are
logged (snapshots every 4 steps, so steps are lost) writes one timeline of
the whole job.

  test_trace_restart.py DTRAIN

The file: both attempts' steps on both ranks (args.attempt 0 up to the
failure, 1 from the step the run continued at, as its `restart 1:` line
says, to the last); rank 0's "restarts" row (tid 3) holds a global
"failure" instant (restart 1, rank 1, killed by signal 9) after the failed
attempt's steps and before the restarted attempt's events, and a
"recovery" span from the failure to the end of the restarted attempt's
first step on rank 0, as long as the run's `recovered:` line (within its
rounding), with from_step and steps_lost as its restart line says.
The summary: `dtrain trace summary` prints the run's `failures:` line (the
same restarts, steps lost and recovery; the training efficiency and time
lost within a few points of the run's: the trace's wall time ends with the
last step, the run's after it) and a line for the restart.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import logged, ranks_of  # noqa: E402

STEPS, KILL_AFTER = 24, 6


def train_with_kill(dtrain, tmp):
    trace, log = os.path.join(tmp, "run.json"), os.path.join(tmp, "log.json")
    cmd = [dtrain, "train", "--model", "tiny", "--nproc", "2", "--max-restarts", "1",
           "--steps", str(STEPS), "--snapshot-every", "4", "--batch-size", "4", "--seq-len", "64",
           "--eval-batches", "0", "--threads", "1", "--print-every", "1000", "--log-json", log,
           "--trace", trace]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 60
    while logged(log) < KILL_AFTER and p.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    pid = ranks_of(p.pid).get(1)
    if pid:
        os.kill(pid, signal.SIGKILL)
    out, _ = p.communicate(timeout=120)
    if p.returncode != 0 or not pid:
        print(out[-3000:])
        raise SystemExit("the run failed (exit %d) or rank 1 was not found" % p.returncode)
    return trace, out


def said(out, pattern, what):
    m = re.search(pattern, out)
    if not m:
        print(out[-3000:])
        raise SystemExit("the run did not print %s" % what)
    return m


def check_steps(ev, restart_step):
    steps = {}
    for e in ev:
        if e["ph"] == "X" and e["tid"] == 2:
            steps.setdefault((e["pid"], e["args"].get("attempt")), []).append(e["args"]["step"])
    for r in (0, 1):
        a0, a1 = sorted(steps.get((r, 0), [])), sorted(steps.get((r, 1), []))
        check(a0 == list(range(len(a0))) and len(a0) >= restart_step,
              "rank %d: the failed attempt's steps 0..%d kept (args.attempt 0), at least up to "
              "the restart's step %d" % (r, len(a0) - 1, restart_step))
        check(a1 == list(range(restart_step, STEPS)),
              "rank %d: the restarted attempt's steps %d..%d (args.attempt 1)"
              % (r, restart_step, STEPS - 1))


def check_marks(ev, restart_step, lost, recovered_s):
    marks = [e for e in ev if e.get("tid") == 3 and e.get("cat") == "restart"]
    fail = [e for e in marks if e["name"] == "failure"]
    rec = [e for e in marks if e["name"] == "recovery"]
    check(len(fail) == 1 and len(rec) == 1, "one failure mark, one recovery mark")
    if len(fail) != 1 or len(rec) != 1:
        return
    f, r = fail[0], rec[0]
    check(f["ph"] == "i" and f["s"] == "g" and f["pid"] == 0 and
          f["args"] == {"restart": 1, "rank": 1, "how": "killed by signal 9 (Killed)"},
          "failure: a global instant, restart 1, rank 1 killed by signal 9 (%s)" % f["args"])
    end0 = max(e["ts"] + e["dur"] for e in ev
               if e["ph"] == "X" and e["tid"] == 2 and e["args"]["attempt"] == 0)
    start1 = min(e["ts"] for e in ev if e["ph"] == "X" and e["args"].get("attempt") == 1)
    # Rank 0 may end a step just after rank 1 died, before the launcher saw it.
    check(end0 <= f["ts"] + 50e3 and f["ts"] < start1,
          "the failure at %.1f ms: after the failed attempt's last step (%.1f ms), before the "
          "restarted attempt's first event (%.1f ms)" % (f["ts"] / 1e3, end0 / 1e3,
                                                        start1 / 1e3))
    first = min((e for e in ev if e["ph"] == "X" and e["tid"] == 2 and e["pid"] == 0 and
                 e["args"]["attempt"] == 1), key=lambda e: e["ts"])
    rend, fend = r["ts"] + r["dur"], first["ts"] + first["dur"]
    check(r["ph"] == "X" and r["pid"] == 0 and abs(r["ts"] - f["ts"]) < 1e-3 and
          0 <= rend - fend < 20e3 and first["args"]["step"] == restart_step,
          "recovery: from the failure to the end of rank 0's first step after it (step %d, "
          "%.3f ms after it)" % (first["args"]["step"], (rend - fend) / 1e3))
    check(abs(r["dur"] * 1e-6 - recovered_s) <= 0.005 + 1e-6,
          "recovery %.6f s, the run's `recovered: %.2f s`" % (r["dur"] * 1e-6, recovered_s))
    check(r["args"] == {"restart": 1, "from_step": restart_step, "steps_lost": lost},
          "recovery's args: from step %d, %d lost (%s)" % (restart_step, lost, r["args"]))


FAILURES = (r"failures: 1 restart\(s\), (\d+) step\(s\) lost, recovery ([\d.]+) s on average "
            r"\(([\d.]+) s at most\), training efficiency ([\d.]+)% \(([\d.]+) s of ([\d.]+) s")


def check_summary(dtrain, trace, run_line, restart_step, lost, recovered_s):
    r = subprocess.run([dtrain, "trace", "summary", trace], capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0, "trace summary: exit 0 (%s)" % r.stderr.strip()[-300:])
    m = re.search(FAILURES, r.stdout)
    check(m is not None, "trace summary prints a failures line")
    if not m:
        print(r.stdout)
        return
    check(m.group(1, 2, 3) == run_line.group(1, 2, 3),
          "the same restarts, steps lost and recovery as the run's line (%s, %s)"
          % (m.group(0), run_line.group(0)))
    eff, lost_s, wall = (float(x) for x in m.group(4, 5, 6))
    reff, rlost_s, rwall = (float(x) for x in run_line.group(4, 5, 6))
    check(abs(eff - reff) <= 3 and abs(lost_s - rlost_s) <= 0.15 and abs(wall - rwall) <= 0.3,
          "efficiency %.1f%% (%.1f s of %.1f s) beside the run's %.1f%% (%.1f s of %.1f s)"
          % (eff, lost_s, wall, reff, rlost_s, rwall))
    want = ("  restart 1 at ", ": rank 1 killed by signal 9 (Killed); continued at step %d, "
            "%d step(s) lost, recovered in %.2f s" % (restart_step, lost, recovered_s))
    check(any(l.startswith(want[0]) and l.endswith(want[1]) for l in r.stdout.splitlines()),
          "the restart's line: ...%s" % want[1])


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        trace, out = train_with_kill(dtrain, tmp)
        m = said(out, r"restart 1: rank 1 killed by signal 9 \(Killed\); continuing at step "
                      r"(\d+) from [^\n]*?, (\d+) step\(s\) lost", "the restart line")
        restart_step, lost = int(m.group(1)), int(m.group(2))
        recovered_s = float(said(out, r"recovered: ([\d.]+) s", "recovered:").group(1))
        run_line = said(out, FAILURES, "the failures line")
        print("run: continuing at step %d, %d lost, recovered in %.2f s"
              % (restart_step, lost, recovered_s))
        ev = json.load(open(trace))["traceEvents"]
        check_steps(ev, restart_step)
        check_marks(ev, restart_step, lost, recovered_s)
        check_summary(dtrain, trace, run_line, restart_step, lost, recovered_s)
    finish()


if __name__ == "__main__":
    main()
