#!/usr/bin/python3
"""What restarts cost (`--max-restarts`): the in-memory snapshot's cost a
step, its copy's bandwidth beside the machine's memcpy bandwidth, and the
recovery time from a SIGKILL to the end of the first step after it, on
GPT-2 small at 2 ranks.

  /usr/bin/python3 bench/bench_restart.py [--dtrain build/dtrain] [--steps 6] [--seq-len 256]
                      [--batch-size 2] [--recovery-batch 1x128]

For each of DDP and ZeRO-3: one run with restarts allowed and a snapshot
every 2 steps, 2 x --steps steps. Each snapshot's copy overlaps the step
after it, so the steps alternate between one with a copy and one
without, in the same process a step apart: the cost is the difference of
their means (the wait for the copy before the update, and the copy's
share of the cores), plus the training thread's begin after the step
(the ranks' agreement and rank 0's manifest). Runs with and without
snapshots, compared whole, differed by a few percent from run to run on
this small machine; steps a step apart share its drift. A snapshot every
step costs each step what one costs the step it overlaps. The run's last
lines give the begin, the wait and the background copy's time.
Then a run at --recovery-batch (a short step: the
recovery ends with one) is killed (rank 1, SIGKILL) halfway through its
third step, and the restarted job's `recovered:` line gives the time from
the failure to the end of the first step after it, with the steps lost.
The issue's targets: at most 3% a step, recovery under 3 s, 0 steps lost.
Timing is of this machine, printed first; nothing here is a unit test.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench_common import print_machine, quiet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "dtrain"))
    ap.add_argument("--steps", type=int, default=6,
                    help="snapshots in the timed run (twice as many steps)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--recovery-batch", default="1x128",
                    help="BxT of the run killed: the recovery ends with a step, so a short one")
    return ap.parse_args()


def memcpy_gbps(mib=512):
    """One thread's copy bandwidth (numpy's copyto is a memcpy), GB/s of
    bytes copied, the best of five."""
    a = np.ones(mib << 18, dtype=np.float32)
    b = np.empty_like(a)
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9


def base(a, log, extra, batch=None, steps=None):
    b, t = (batch or "%dx%d" % (a.batch_size, a.seq_len)).split("x")
    return [a.dtrain, "train", "--model", "gpt2", "--steps", str(steps or a.steps),
            "--batch-size", b,
            "--seq-len", t, "--eval-batches", "0", "--threads", "1", "--print-every", "1",
            "--nproc", "2", "--log-json", log] + extra


def step_ms(log):
    e = [json.loads(l) for l in open(log) if '"loss"' in l][1:]
    return sum(x["ms"] for x in e) / len(e)


def snapshot_cost(a, tmp, name, extra):
    """One run with a snapshot every 2 steps: each copy overlaps the step
    after its snapshot, so the steps alternate with and without one, and
    their means, from the same process a step apart, share the machine's
    drift (two runs, with and without snapshots, differed by a few percent
    here). Returns the training thread's begin and wait a snapshot, the
    copy's time, the share the summary gives, and the two step means."""
    log = os.path.join(tmp, name + ".json")
    r = subprocess.run(base(a, log, extra + ["--snapshot-every", "2", "--max-restarts", "1"],
                            steps=2 * a.steps),
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stdout[-2000:] + r.stderr[-2000:])
    m = re.search(r"snapshots: (\d+) in memory .*, ([\d.]+) ms each on the training thread "
                  r"\(([\d.]+) ms of it waiting.*\), ([\d.]+)% of the training time"
                  r"(?:; copied in the background in (\d+) ms each)?", r.stdout)
    ms, wait, bg, share = [float(m.group(g)) if m.group(g) else None for g in (2, 3, 5, 4)]
    # Log steps count from 0: a snapshot follows each odd one, and its copy
    # overlaps the next; the first two steps (kernels built) are left out.
    e = [json.loads(l) for l in open(log) if '"loss"' in l]
    with_ms = np.mean([x["ms"] for x in e if x["step"] >= 2 and x["step"] % 2 == 0])
    off = np.mean([x["ms"] for x in e if x["step"] >= 3 and x["step"] % 2 == 1])
    return ms, wait, bg, share, float(with_ms), float(off)


def recovery(a, tmp, name, extra):
    """Rank 1 killed halfway through the third step (half the second's
    time after its line): the recovery, the steps lost and the step time."""
    log = os.path.join(tmp, name + "-kill.json")
    p = subprocess.Popen(base(a, log, extra + ["--max-restarts", "1"], a.recovery_batch),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    def entries():
        if not os.path.exists(log):
            return []
        return [json.loads(l) for l in open(log) if '"loss"' in l]
    while p.poll() is None and len(entries()) < 2:
        time.sleep(0.01)
    step = entries()[1]["ms"] / 1e3
    time.sleep(step / 2)
    kids = open("/proc/%d/task/%d/children" % (p.pid, p.pid)).read().split()
    for pid in kids:
        env = open("/proc/%s/environ" % pid, "rb").read()
        if b"RANK=1\0" in env and b"LOCAL_RANK=1\0" in env:
            os.kill(int(pid), signal.SIGKILL)
    out, _ = p.communicate()
    rec = re.search(r"recovered: ([\d.]+) s", out)
    lost = re.search(r"(\d+) step\(s\) lost", out)
    parts = re.search(r"recovered: .*\((.*)\)", out)
    if parts:
        print("  %s recovery: %s" % (name, parts.group(1)))
    return (float(rec.group(1)) if rec else None), (int(lost.group(1)) if lost else None), step


def main():
    a = parse_args()
    print_machine(a.dtrain)
    busy = quiet()
    bw = memcpy_gbps()
    print("GPT-2 small, 2 ranks, batch %d x %d, 1 thread a rank; other load at start %.0f%%; "
          "memcpy %.1f GB/s (one thread)" % (a.batch_size, a.seq_len, 100 * busy, bw))
    params = 124439808
    state_gb = params * 12 / 1e9
    print("%-8s %9s %8s %8s %10s %9s %9s %7s %11s %9s %5s" % (
        "layout", "begin ms", "wait ms", "copy ms", "copy GB/s", "step ms", "(no copy)", "cost",
        "recovery s", "(step s)", "lost"))
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("ddp", []), ("zero-3", ["--zero-stage", "3"])):
            ms, wait, bg, share, with_ms, off = snapshot_cost(a, tmp, name, extra)
            rec, lost, step = recovery(a, tmp, name, extra)
            # Each of the 2 ranks copies half the state (DDP splits it,
            # ZeRO-3 holds half). A snapshot's cost a step: what it adds to
            # the step (the wait for the copy, and the copy's share of the
            # cores), and the training thread's begin after the step.
            begin = ms - wait
            cost = (with_ms - off + begin) / off
            print("%-8s %9.0f %8.0f %8s %10s %9.0f %9.0f %6.1f%% %11s %9.2f %5s" % (
                name, begin, wait, "%.0f" % bg if bg is not None else "-",
                "%.2f" % (state_gb / 2 / (bg / 1e3)) if bg else "-", with_ms, off,
                100 * cost, "%.2f" % rec if rec is not None else "-", step,
                lost if lost is not None else "-"))
    print("targets: cost <= 3%% a step (a snapshot every step costs each step what one costs "
          "the step it overlaps); recovery < 3 s (kill to the end of the first step after it, "
          "batch %s), 0 steps lost" % a.recovery_batch)


if __name__ == "__main__":
    main()
