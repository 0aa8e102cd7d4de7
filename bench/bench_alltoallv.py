#!/usr/bin/python3
"""dtrain's variable all-to-all against Open MPI's MPI_Alltoallv, on this
machine's shared memory: `dtrain bench comm --op alltoallv --peer mpi`
(both timed in the same processes, size by size, on the same uneven
blocks; see docs/bench_comm.md) run --repeat times at each rank count,
and per size the median of each side's bus bandwidth and of the ratio of
the two measured side by side. A shared machine's load moves single runs
by 2x either way; the medians of runs interleaved this way move much
less. The issue's target is a ratio of at least --target at every size.

usage: bench_alltoallv.py [--dtrain build/dtrain] [--ranks 2,4] [--repeat 5]
                          [--algo auto] [--min-bytes 4K] [--max-bytes 64M]
"""
import argparse
import csv
import io
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "dtrain"))
    ap.add_argument("--ranks", default="2,4", help="rank counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--algo", default="auto")
    ap.add_argument("--min-bytes", default="4K")
    ap.add_argument("--max-bytes", default="64M")
    ap.add_argument("--target", type=float, default=1.5)
    return ap.parse_args()


def one_run(a, n):
    """{bytes: (ours busbw, MPI's busbw, the algorithm that ran)} of one run."""
    cmd = [a.dtrain, "bench", "comm", "--nproc", str(n), "--op", "alltoallv", "--algo", a.algo,
           "--peer", "mpi", "--min-bytes", a.min_bytes, "--max-bytes", a.max_bytes,
           "--format", "csv"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), r.returncode, (r.stdout + r.stderr)[-3000:]))
    out = {}
    for row in csv.DictReader(io.StringIO(r.stdout)):
        if row["peer"] or row["inplace"] != "0":
            continue
        if int(row["wrong"]):
            sys.exit("#wrong %s at %s B: %s" % (row["wrong"], row["bytes"], " ".join(cmd)))
        out[int(row["bytes"])] = (float(row["busbw_gbps"]), float(row["peer_busbw_gbps"]),
                                  row["ran"])
    return out


def main():
    a = parse_args()
    for n in [int(x) for x in a.ranks.split(",")]:
        runs = [one_run(a, n) for _ in range(a.repeat)]
        cores = os.cpu_count()
        print("\n%d ranks over shared memory%s, %d runs, medians (busbw, GB/s)" %
              (n, " (more ranks than the %d cores)" % cores if n > cores else "", a.repeat))
        print("| size per rank | dtrain (%s) | Open MPI | dtrain / MPI | range of the ratio |"
              % a.algo)
        print("|---|---|---|---|---|")
        short = []
        for size in sorted(runs[0]):
            ours = statistics.median(r[size][0] for r in runs)
            mpi = statistics.median(r[size][1] for r in runs)
            ratios = [r[size][0] / r[size][1] for r in runs]
            ratio = statistics.median(ratios)
            algos = sorted({r[size][2] for r in runs})
            if ratio < a.target:
                short.append(size)
            print("| %s | %.3f (%s) | %.3f | %.2fx | %.2f-%.2f |" %
                  (human(size), ours, "/".join(algos), mpi, ratio, min(ratios), max(ratios)))
        print("short of %.1fx at: %s" % (a.target, ", ".join(human(s) for s in short) or "none"))


def human(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return "%.4g %s" % (b / k, unit)
    return "%d B" % b


if __name__ == "__main__":
    main()
