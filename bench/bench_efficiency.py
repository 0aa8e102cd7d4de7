#!/usr/bin/python3
"""Training efficiency through failures (torchft's measure): GPT-2 small at
2 ranks with `--max-restarts`, a random rank SIGKILLed at a random moment
every --kill-every seconds, for about --minutes of training; the run's own
`failures:` line gives the share of the wall time that failures did not
take (each failure's recovery, less the step that ends it, and the steps
it lost). With --compare, the same number of steps runs again undisturbed
and the two final weights files are compared byte for byte.

  /usr/bin/python3 bench/bench_efficiency.py [--dtrain build/dtrain] [--minutes 10]
                        [--kill-every 60] [--batch 1x128] [--compare]

The issue's target: at least 95% with a kill every 60 s over 10 minutes
(torchft reports 82% with a failure a minute on 300 GPUs), and the final
weights bit-identical to the undisturbed run's. Timing is of this
machine, printed first; nothing here is a unit test.
"""
import argparse
import filecmp
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

from bench_common import print_machine, quiet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "dtrain"))
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--kill-every", type=float, default=60)
    ap.add_argument("--batch", default="1x128", help="B x T a rank")
    ap.add_argument("--compare", action="store_true",
                    help="run the same steps undisturbed and compare the final weights")
    ap.add_argument("--seed", type=int, default=1)
    return ap.parse_args()


def command(a, steps, log, final, restarts):
    b, t = a.batch.split("x")
    cmd = [a.dtrain, "train", "--model", "gpt2", "--steps", str(steps), "--batch-size", b,
           "--seq-len", t, "--eval-batches", "0", "--threads", "1", "--print-every", "10",
           "--nproc", "2", "--log-json", log, "--save-final", final, "--lr-schedule", "constant"]
    return cmd + (["--max-restarts", str(restarts)] if restarts else [])


def step_seconds(a, tmp):
    """The undisturbed pace, from a short run (its steps after the first)."""
    log = os.path.join(tmp, "pace.json")
    r = subprocess.run(command(a, 4, log, os.path.join(tmp, "pace.st"), 0), capture_output=True,
                       text=True)
    if r.returncode:
        sys.exit(r.stdout[-2000:] + r.stderr[-2000:])
    ms = [json.loads(l)["ms"] for l in open(log) if '"loss"' in l][1:]
    return sum(ms) / len(ms) / 1e3


def ranks(pid):
    kids = open("/proc/%d/task/%d/children" % (pid, pid)).read().split()
    return [int(k) for k in kids]


def disturbed(a, tmp, steps, rng):
    log, final = os.path.join(tmp, "kills.json"), os.path.join(tmp, "kills.st")
    restarts = int(a.minutes * 60 / a.kill_every) + 5
    p = subprocess.Popen(command(a, steps, log, final, restarts), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    kills, t0 = 0, time.time()
    while True:
        # A random moment within each period, so that kills land anywhere
        # in a step (forward, backward, the all-reduce, the update, a copy).
        wait = a.kill_every * (0.5 + rng.random())
        deadline = time.time() + wait
        while p.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        if p.poll() is not None:
            break
        try:
            os.kill(rng.choice(ranks(p.pid)), signal.SIGKILL)
            kills += 1
        except (IndexError, ProcessLookupError, FileNotFoundError):
            pass
    out = p.stdout.read()
    return p.returncode, out, kills, time.time() - t0, final


def main():
    a = parse_args()
    print_machine(a.dtrain)
    busy = quiet()
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        pace = step_seconds(a, tmp)
        steps = max(4, int(a.minutes * 60 / pace))
        print("GPT-2 small, 2 ranks, batch %s a rank, %.2f s a step undisturbed; %d steps "
              "(about %.1f minutes), a rank killed every %.0f s on average; other load at "
              "start %.0f%%" % (a.batch, pace, steps, a.minutes, a.kill_every, 100 * busy))
        rc, out, kills, wall, final = disturbed(a, tmp, steps, rng)
        fail = re.search(r"failures: .*", out)
        print("exit %d after %.0f s, %d kill(s)" % (rc, wall, kills))
        print(fail.group(0) if fail else "no failures line:\n" + out[-3000:])
        snap = re.search(r"snapshots: .*", out)
        if snap:
            print("last attempt's " + snap.group(0))
        if a.compare and rc == 0:
            log2, final2 = os.path.join(tmp, "calm.json"), os.path.join(tmp, "calm.st")
            r = subprocess.run(command(a, steps, log2, final2, 0), capture_output=True, text=True)
            same = r.returncode == 0 and filecmp.cmp(final, final2, shallow=False)
            print("final weights %s the undisturbed run's" %
                  ("bit-identical to" if same else "DIFFER from"))
        print("target: training efficiency >= 95%, final weights bit-identical")


if __name__ == "__main__":
    main()
