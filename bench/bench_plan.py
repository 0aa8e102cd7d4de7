"""`dtrain plan`'s predictions against runs on this machine: for each of a
dozen layouts at 2 to 8 ranks, the plan's memory per rank (the rank that
holds the most: model state and activations) and step time, beside what
`dtrain train` of that layout accounted and measured, with the ratio.

  python3 bench/bench_plan.py [--steps N] [--skip K] [--dtrain PATH] [--builtin-links]

The model is a small GPT (4 layers, 4 heads, width 256, sequences of 128,
vocabulary 256), fp32, one thread per rank, a global batch of 16
sequences; the plan runs with this machine's link model, calibrated first
by `dtrain bench comm --calibrate` (--builtin-links: the built-in one
instead), and the compute rate it measures here (a layer forward and
backward on one core). Runs at 4 and 8 ranks on a machine with fewer
cores are oversubscribed: the ranks share the cores, which the plan
models as the host's work over its cores; the table marks them.

The issue's targets: memory within 10% of the measured peak and step time
within 25% of the measured, for at least 10 layouts (13 here); the best predicted
layout the best measured, or within 10% of it. The step time is the
median over the steps after the first `skip`; the machine's other load
shows in it, so run this on a quiet machine.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

MODEL = ["--n-layer", "4", "--n-head", "4", "--n-embd", "256", "--block-size", "128",
         "--vocab-size", "256"]
BATCH = 16

# name, ranks, sizes (tp, cp, pp), ZeRO stage, micro-batch, schedule
LAYOUTS = [
    ("DDP", 2, (1, 1, 1), 0, 8, None),
    ("ZeRO-1", 2, (1, 1, 1), 1, 8, None),
    ("ZeRO-3", 2, (1, 1, 1), 3, 8, None),
    ("tp 2", 2, (2, 1, 1), 0, 16, None),
    ("cp 2", 2, (1, 2, 1), 0, 16, None),
    ("pp 2 1f1b", 2, (1, 1, 2), 0, 2, "1f1b"),
    ("pp 2 zb1p", 2, (1, 1, 2), 0, 2, "zb1p"),
    ("DDP x4", 4, (1, 1, 1), 0, 4, None),
    ("ZeRO-3 x4", 4, (1, 1, 1), 3, 4, None),
    ("tp 2 x dp 2", 4, (2, 1, 1), 0, 8, None),
    ("pp 2 x dp 2", 4, (1, 1, 2), 1, 2, "1f1b"),
    ("tp 2 x cp 2", 4, (2, 2, 1), 0, 16, None),
    ("dp 2 x pp 2 x tp 2", 8, (2, 1, 2), 0, 2, "1f1b"),
]


def plan_args(links, ranks, sizes, zero, micro, sched):
    tp, cp, pp = sizes
    a = ["plan"] + MODEL + ["--global-batch", str(BATCH), "--nodes", "1", "--ranks-per-node",
                            str(ranks), "--mem-per-rank", "64", "--fp32", "--link-model", links,
                            "--tp", str(tp),
                            "--cp", str(cp), "--pp", str(pp), "--zero-stage", str(zero),
                            "--micro-batch", str(micro), "--recompute", "none", "--json",
                            "--top", "1"]
    return a + (["--pp-schedule", sched] if sched else [])


def predicted(a, ranks, sizes, zero, micro, sched):
    r = subprocess.run([a.dtrain] + plan_args(a.links, ranks, sizes, zero, micro, sched),
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("dtrain plan failed:\n%s" % (r.stdout + r.stderr)[-2000:])
    return json.loads(r.stdout)["best"][0]


def accounted_peak(out):
    """The largest rank's model state and activations at the end, MiB, from
    either form of the run's memory table."""
    end = out.split("peak memory per rank")[-1]
    totals = []
    for line in end.splitlines():
        m = re.search(r"params ([0-9.]+) MiB \| grads ([0-9.]+) MiB \| optim ([0-9.]+) MiB \| "
                      r"acts ([0-9.]+) MiB", line)
        if m and "plan" not in line:
            totals.append(sum(float(x) for x in m.groups()))
            continue
        m = re.match(r"\s+rank \d+\s+([0-9.]+) x\S+\s+([0-9.]+) x\S+\s+([0-9.]+) x\S+\s+"
                     r"[0-9.]+ x\S+\s+([0-9.]+) x", line)
        if m:
            totals.append(sum(float(x) for x in m.groups()))
    return max(totals) if totals else float("nan")


def measured(a, data, tmp, name, ranks, sizes, zero, micro, sched):
    tp, cp, pp = sizes
    log = os.path.join(tmp, name.replace(" ", "_") + ".json")
    cmd = [a.dtrain, "train", "--data", data] + MODEL + [
        "--steps", str(a.steps), "--threads", "1", "--nproc", str(ranks), "--tp", str(tp),
        "--cp", str(cp), "--pp", str(pp), "--zero-stage", str(zero), "--batch-size", str(micro),
        "--grad-accum", str(BATCH * tp * cp * pp // (ranks * micro)), "--eval-batches", "0",
        "--print-every", "1000000", "--log-json", log, "--shuffle", "0"]
    if sched:
        cmd += ["--pp-schedule", sched]
    if tp > 1:
        cmd += ["--sequence-parallel"]  # the plan's layouts split the rows with tp
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-2000:]))
    ms = [json.loads(l)["ms"] for l in open(log) if '"loss"' in l][a.skip:]
    return statistics.median(ms), accounted_peak(r.stdout)


def plan_order(a, ranks):
    """The planner's own ranking of every layout at `ranks` (ties broken its
    way), as (tp, cp, pp, zero, micro, schedule) keys."""
    r = subprocess.run([a.dtrain, "plan"] + MODEL + [
        "--global-batch", str(BATCH), "--nodes", "1", "--ranks-per-node", str(ranks),
        "--mem-per-rank", "64", "--fp32", "--link-model", a.links, "--recompute", "none",
        "--json", "--top", "1000"],
        capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("dtrain plan failed:\n%s" % (r.stdout + r.stderr)[-2000:])
    return [(b["tp"], b["cp"], b["pp"], b["zero_stage"], b["micro_batch"],
             b["schedule"] if b["pp"] > 1 else None) for b in json.loads(r.stdout)["best"]]


def predicted_best(a, ranks, group):
    """Of the benchmark's layouts at `ranks`, the one the planner ranks first."""
    order = plan_order(a, ranks)
    return min(group, key=lambda r: order.index(r[6]) if r[6] in order else len(order))


def main():
    a = bc.parse_args((("--builtin-links", "the built-in link model, not one calibrated here"),))
    bc.print_machine(a.dtrain)
    cores = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_plan_") as tmp:
        a.links = "builtin" if a.builtin_links else bc.calibrate_links(a.dtrain, tmp)
        print("link model: %s" % ("built-in" if a.builtin_links else
                                  "calibrated here (dtrain bench comm --calibrate)"), flush=True)
        data = os.path.join(tmp, "data.txt")
        bc.write_corpus(data, 400000)
        for name, ranks, sizes, zero, micro, sched in LAYOUTS:
            p = predicted(a, ranks, sizes, zero, micro, sched)
            busy = bc.quiet()
            ms, mib = measured(a, data, tmp, name, ranks, sizes, zero, micro, sched)
            key = (sizes[0], sizes[1], sizes[2], zero, micro, sched)
            rows.append((name, ranks, p["step_s"] * 1e3, ms, p["memory_bytes"] / 2**20, mib,
                         key))
            print("  %-20s %d ranks%s: step %.0f ms predicted, %.0f measured (x%.2f); memory "
                  "%.1f MiB predicted, %.1f accounted (x%.3f); machine %.0f%% busy before" % (
                      name, ranks, " (oversubscribed)" if ranks > cores else "",
                      rows[-1][2], ms, rows[-1][2] / ms, rows[-1][4], mib, rows[-1][4] / mib,
                      100 * busy), flush=True)
        t_ok = sum(abs(r[2] / r[3] - 1) <= 0.25 for r in rows)
        m_ok = sum(abs(r[4] / r[5] - 1) <= 0.10 for r in rows)
        print("\nstep time within 25%%: %d of %d layouts; memory within 10%%: %d of %d" %
              (t_ok, len(rows), m_ok, len(rows)))
        for k in sorted({r[1] for r in rows}):
            group = [r for r in rows if r[1] == k]
            bp = predicted_best(a, k, group)
            bm = min(group, key=lambda r: r[3])
            print("at %d ranks: predicted best %s (measured %.0f ms), measured best %s (%.0f ms): "
                  "x%.2f" % (k, bp[0], bp[3], bm[0], bm[3], bp[3] / bm[3]))


if __name__ == "__main__":
    main()
