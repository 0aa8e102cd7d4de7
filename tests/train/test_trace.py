"""--trace and `dtrain trace summary` end to end, on a real 2-rank DDP run.

  test_trace.py DTRAIN

The file: valid Trace Event JSON (traceEvents, displayTimeUnit ms, named
  processes and threads), pids 0 and 1; per rank one "step" event per
  step (args.step 0..S-1), a forward and a backward per micro-batch
  (micro 0..G-1, layers 0-3), grad_norm and optimizer per step; compute
  events never overlap one another; the allreduce events carry bytes, and
  each rank's add up to 4 bytes x Psi x S (every bucket once a step, fp32
  on the wire; Psi from the run's own header); every complete event lies
  inside the run.
The summary: per rank busy + comm + idle = 1 within 1e-3, and each
  fraction equals what this script computes from the JSON itself (unions
  and intersections of intervals), for the default window (steps 1..) and
  for --from-step 0.
Clocks: with DTRAIN_TRACE_CLOCK_SYNC=1 the ranks estimate their offset by
  ping-pong although they share the clock: the estimate, the error of the
  method, is under 5 ms.
Bad input: an unwritable --trace is refused before training; the summary
  of a missing file, of text that is not JSON, of a file without events,
  and --from-step past the last step exit non-zero naming the problem.
"""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import run  # noqa: E402

STEPS, ACCUM = 4, 2


def train(dtrain, path, env=None):
    args = ["train", "--nproc", "2", "--steps", str(STEPS), "--grad-accum", str(ACCUM),
            "--batch-size", "4", "--threads", "1", "--bucket-mb", "1", "--eval-batches", "0",
            "--print-every", "100", "--trace", path]
    r = run(dtrain, args, env=env)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        raise SystemExit("dtrain train --trace failed")
    return r.stdout + r.stderr


# ---- intervals, independently of the C code ----------------------------------------

def union(iv):
    out = []
    for lo, hi in sorted(iv):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def intersect(a, b):
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo < hi:
                out.append([lo, hi])
    return union(out)


def length(iv):
    return sum(hi - lo for lo, hi in iv)


def fractions(events, pid, from_step):
    xs = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
    lane = lambda tid: [[e["ts"], e["ts"] + e["dur"]] for e in xs if e["tid"] == tid]
    win = union([[e["ts"], e["ts"] + e["dur"]] for e in xs
                 if e["tid"] == 2 and e["args"]["step"] >= from_step])
    busy = intersect(union(lane(0)), win)
    comm = intersect(union(lane(1)), win)
    exposed = length(comm) - length(intersect(comm, busy))
    w = length(win)
    return length(busy) / w, exposed / w, (w - length(busy) - exposed) / w


# ---- the file -----------------------------------------------------------------------

def check_file(doc, psi):
    ev = doc.get("traceEvents")
    check(isinstance(ev, list) and doc.get("displayTimeUnit") == "ms",
          "traceEvents is a list, displayTimeUnit ms")
    xs = [e for e in ev if e["ph"] == "X"]
    check(all(set(e) >= {"name", "ph", "pid", "tid", "ts", "dur"} and e["dur"] >= 0
              and e["ts"] >= 0 for e in xs), "every complete event has name, pid, tid, ts >= 0, dur >= 0")
    check({e["pid"] for e in xs} == {0, 1}, "two pids: 0 and 1")
    names = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    check(names == {(0, "rank 0"), (1, "rank 1")}, "processes named rank 0, rank 1: %s" % names)
    threads = {(e["pid"], e["tid"], e["args"]["name"]) for e in ev
               if e["ph"] == "M" and e["name"] == "thread_name"}
    check(threads == {(p, t, n) for p in (0, 1) for t, n in enumerate(("compute", "communication", "steps"))},
          "threads compute, communication, steps on each rank")
    check(min(e["ts"] for e in xs) == 0, "times start at the job's earliest event")
    for pid in (0, 1):
        check_rank(xs, pid, psi)


def check_rank(xs, pid, psi):
    mine = [e for e in xs if e["pid"] == pid]
    steps = sorted(e["args"]["step"] for e in mine if e["tid"] == 2 and e["name"] == "step")
    check(steps == list(range(STEPS)), "rank %d: step events 0..%d: %s" % (pid, STEPS - 1, steps))
    for name in ("forward", "backward"):
        micro = sorted(e["args"]["micro"] for e in mine if e["name"] == name)
        check(micro == sorted(list(range(ACCUM)) * STEPS), "rank %d: %s per micro-batch" % (pid, name))
        check(all(e["args"]["layers"] == "0-3" and e["tid"] == 0 for e in mine if e["name"] == name),
              "rank %d: %s on the compute lane, layers 0-3" % (pid, name))
    for name in ("grad_norm", "optimizer"):
        got = sorted(e["args"]["step"] for e in mine if e["name"] == name)
        check(got == list(range(STEPS)), "rank %d: %s once a step" % (pid, name))
    comp = sorted((e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == 0)
    overlaps = [(a, b) for a, b in zip(comp, comp[1:]) if b[0] < a[1] - 0.002]
    check(not overlaps, "rank %d: compute events never overlap (%d do)" % (pid, len(overlaps)))
    ar = [e for e in mine if e["name"] == "allreduce"]
    check(ar and all(e["tid"] == 1 and e["args"]["bytes"] > 0 for e in ar),
          "rank %d: %d allreduce events on the comm lane, each with bytes" % (pid, len(ar)))
    total = sum(e["args"]["bytes"] for e in ar)
    check(total == 4 * psi * STEPS, "rank %d: allreduce bytes %d = 4 x Psi x %d steps = %d"
          % (pid, total, STEPS, 4 * psi * STEPS))
    span = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == 2]
    lo, hi = min(s[0] for s in span), max(s[1] for s in span)
    inside = all(e["ts"] >= lo - 0.002 and e["ts"] + e["dur"] <= hi + 0.002 for e in mine)
    check(inside, "rank %d: every event lies within its steps" % pid)


# ---- the summary ---------------------------------------------------------------------

def summary_rows(text):
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^(\d+|job)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)", line)
        if m:
            rows[m.group(1)] = [float(m.group(i)) for i in range(2, 6)]
    return rows


def check_summary(dtrain, path, events, extra, from_step):
    r = run(dtrain, ["trace", "summary", path] + extra)
    rows = summary_rows(r.stdout)
    check(r.returncode == 0 and set(rows) == {"0", "1", "job"},
          "trace summary %s: rows 0, 1, job (exit %d)" % (" ".join(extra), r.returncode))
    if set(rows) != {"0", "1", "job"}:
        print(r.stdout, r.stderr)
        return
    mean = [0.0, 0.0, 0.0]
    for pid in (0, 1):
        _, busy, comm, idle = rows[str(pid)]
        check(abs(busy + comm + idle - 1) < 1e-3, "rank %d: busy %.4f + comm %.4f + idle %.4f = 1"
              % (pid, busy, comm, idle))
        want = fractions(events, pid, from_step)
        check(all(abs(g - w) < 1e-3 for g, w in zip((busy, comm, idle), want)),
              "rank %d from step %d: printed %.4f %.4f %.4f, computed here %.4f %.4f %.4f"
              % ((pid, from_step, busy, comm, idle) + want))
        mean = [m + w / 2 for m, w in zip(mean, want)]
    check(all(abs(g - w) < 1e-3 for g, w in zip(rows["job"][1:], mean)),
          "the job's line: the means over ranks %s" % rows["job"][1:])


def check_refusals(dtrain, tmp, good):
    r = run(dtrain, ["train", "--steps", "1", "--trace", os.path.join(tmp, "no", "dir", "t.json")])
    msg = r.stdout + r.stderr
    check(r.returncode != 0 and "--trace" in msg and "does not exist" in msg and "step 1/" not in msg,
          "an unwritable --trace is refused before training: %s" % msg.strip().splitlines()[-1:])
    bad = os.path.join(tmp, "bad.json")
    empty = os.path.join(tmp, "empty.json")
    open(bad, "w").write("{\"traceEvents\": [")
    open(empty, "w").write("{\"traceEvents\": []}")
    cases = [([os.path.join(tmp, "missing.json")], "missing.json"),
             ([bad], "not valid JSON"), ([empty], "no events"),
             ([good, "--from-step", "99"], "--from-step 99"),
             ([good, "--from-step", "x"], "--from-step")]
    for args, want in cases:
        r = run(dtrain, ["trace", "summary"] + args)
        check(r.returncode != 0 and want in r.stderr,
              "trace summary %s: refused naming %r (exit %d: %s)"
              % (" ".join(args[1:]) or os.path.basename(args[0]), want, r.returncode, r.stderr.strip()))


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        out = train(dtrain, path)
        check(("trace %s" % path) in out, "rank 0 prints where the trace went")
        psi = int(re.search(r"Psi = (\d+) parameters", out).group(1))
        doc = json.load(open(path))
        check_file(doc, psi)
        check_summary(dtrain, path, doc["traceEvents"], [], 1)
        check_summary(dtrain, path, doc["traceEvents"], ["--from-step", "0"], 0)
        synced = os.path.join(tmp, "synced.json")
        train(dtrain, synced, env={"DTRAIN_TRACE_CLOCK_SYNC": "1"})
        other = json.load(open(synced))["otherData"]
        offs = other["clock_offsets_ns"]
        check("estimated" in other["clock"] and offs[0] == 0 and abs(offs[1]) < 5e6,
              "ping-pong on one clock: rank 1's offset %d ns is near 0" % offs[1])
        check_refusals(dtrain, tmp, path)
    finish()


if __name__ == "__main__":
    main()
