#!/usr/bin/python3
"""dtrain's variable all-to-all against Open MPI's MPI_Alltoallv, on this
machine's shared memory: `dtrain bench comm --op alltoallv --peer mpi`
(both timed in the same processes, size by size, on the same uneven
blocks, in buffers from dt_comm_mem_alloc unless --buffers malloc; see
docs/bench_comm.md) run --repeat times at each rank count,
and per size the median of each side's bus bandwidth and of the ratio of
the two measured side by side. A shared machine's load moves single runs
by 2x either way; the medians of runs interleaved this way move much
less, and each side's busbw as a share of the copy bandwidth bench comm
measures first (mem%: how near each library came to the machine's
limit). The issue's target is a ratio of at least --target at every size.

Each size is timed for a few milliseconds at least: bench comm's own
counts (1000 calls up to 64 KiB, 100 up to 4 MiB) time a 4 KiB call for
about 1 ms and a 256 KiB one for 2, where one tick of another process
moves the figure by a third; here sizes up to 64 KiB take 10000 calls
and those up to 1 MiB 1000 (a tenth of them first as warm-up, as bench
comm does).

Before each run the benchmark waits (up to --quiet-wait seconds) for the
machine to be under 10% busy, and it measures the other load during the
run: the share of the CPUs busy beyond what its own processes used
(/proc/stat less their CPU time), printed per rank count (median and
highest). A run beside another job measures that job too.

usage: bench_alltoallv.py [--dtrain build/dtrain] [--ranks 2,4] [--repeat 5]
                          [--algo auto] [--min-bytes 4K] [--max-bytes 64M]
                          [--quiet-wait 60]
"""
import argparse
import csv
import io
import os
import resource
import statistics
import subprocess
import sys

from bench_common import print_machine, quiet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (largest size, timed calls): the bands of sizes timed alike; None is
# bench comm's own count.
BANDS = ((64 << 10, 10000), (1 << 20, 1000), (None, None))


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "dtrain"))
    ap.add_argument("--ranks", default="2,4", help="rank counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--algo", default="auto")
    ap.add_argument("--buffers", default="comm", choices=("comm", "malloc"),
                    help="both libraries' buffers: dt_comm_mem_alloc (comm) or malloc")
    ap.add_argument("--min-bytes", default="4K")
    ap.add_argument("--max-bytes", default="64M")
    ap.add_argument("--target", type=float, default=1.5)
    ap.add_argument("--quiet-wait", type=float, default=60,
                    help="seconds to wait for an idle machine before each run")
    return ap.parse_args()


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.upper().replace("IB", "").replace("B", "")
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def bands(a):
    """(first size, last size, timed calls or None) of each band the sweep
    (bench comm's: from --min-bytes, 4 times larger each) meets."""
    sizes, s = [], parse_size(a.min_bytes)
    while s <= parse_size(a.max_bytes):
        sizes.append(s)
        s *= 4
    out = []
    for top, iters in BANDS:
        mine = [x for x in sizes if top is None or x <= top]
        if mine:
            out.append((mine[0], mine[-1], iters))
        sizes = sizes[len(mine):]
    return out


def cpu_seconds():
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat)."""
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(v) - v[3] - v[4]) / tick, sum(v) / tick


def children_seconds():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def one_band(a, n, lo, hi, iters, out):
    """Adds {bytes: (ours busbw, MPI's busbw, the algorithm that ran)} of
    sizes lo..hi to out."""
    cmd = [a.dtrain, "bench", "comm", "--nproc", str(n), "--op", "alltoallv", "--algo", a.algo,
           "--peer", "mpi", "--min-bytes", str(lo), "--max-bytes", str(hi), "--format", "csv",
           "--buffers", a.buffers]
    if iters:
        cmd += ["--iters", str(iters)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), r.returncode, (r.stdout + r.stderr)[-3000:]))
    for row in csv.DictReader(io.StringIO(r.stdout)):
        if row["peer"] or row["inplace"] != "0":
            continue
        if int(row["wrong"]):
            sys.exit("#wrong %s at %s B: %s" % (row["wrong"], row["bytes"], " ".join(cmd)))
        out[int(row["bytes"])] = (float(row["busbw_gbps"]), float(row["peer_busbw_gbps"]),
                                  row["ran"], float(row["mem_eff_pct"]))


def one_run(a, n):
    """({bytes: (ours busbw, MPI's busbw, the algorithm that ran, our busbw
    as a share of the copy bandwidth)}, the
    share of the CPUs others used meanwhile) of one run."""
    quiet(a.quiet_wait)
    (busy0, total0), ours0 = cpu_seconds(), children_seconds()
    out = {}
    for lo, hi, iters in bands(a):
        one_band(a, n, lo, hi, iters, out)
    (busy1, total1), ours1 = cpu_seconds(), children_seconds()
    others = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / max(1e-9, total1 - total0)
    return out, others


def main():
    a = parse_args()
    print_machine(a.dtrain)
    for n in [int(x) for x in a.ranks.split(",")]:
        runs, others = zip(*[one_run(a, n) for _ in range(a.repeat)])
        cores = os.cpu_count()
        print("\n%d ranks over shared memory%s, %d runs, medians (busbw, GB/s); both libraries'"
              " buffers from %s" %
              (n, " (more ranks than the %d cores)" % cores if n > cores else "", a.repeat,
               "dt_comm_mem_alloc (--buffers comm)" if a.buffers == "comm" else "malloc"))
        print("other load during the runs: %.0f%% of the CPUs (median), %.0f%% at most" %
              (100 * statistics.median(others), 100 * max(others)))
        print("mem%: busbw over the copy bandwidth `bench comm` measured at the start of the"
              " run (docs/bench_comm.md), the share of the machine's limit each library reached")
        print("| size per rank | dtrain (%s) | Open MPI | dtrain / MPI | range of the ratio |"
              " mem%% dtrain, MPI |" % a.algo)
        print("|---|---|---|---|---|---|")
        short = []
        for size in sorted(runs[0]):
            ours = statistics.median(r[size][0] for r in runs)
            mpi = statistics.median(r[size][1] for r in runs)
            ratios = [r[size][0] / r[size][1] for r in runs]
            ratio = statistics.median(ratios)
            algos = sorted({r[size][2] for r in runs})
            if ratio < a.target:
                short.append(size)
            mem = statistics.median(r[size][3] for r in runs)
            mem_mpi = statistics.median(r[size][3] * r[size][1] / r[size][0] for r in runs)
            print("| %s | %.3f (%s) | %.3f | %.2fx | %.2f-%.2f | %.0f, %.0f |" %
                  (human(size), ours, "/".join(algos), mpi, ratio, min(ratios), max(ratios),
                   mem, mem_mpi))
        print("short of %.1fx at: %s" % (a.target, ", ".join(human(s) for s in short) or "none"))


def human(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return "%.4g %s" % (b / k, unit)
    return "%d B" % b


if __name__ == "__main__":
    main()
