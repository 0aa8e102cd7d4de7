"""`dtrain simulate --layout` against real runs of the same layouts on this
machine: DDP, ZeRO-3, a 1F1B pipeline (pp 2) and tensor parallelism (tp 2)
at 2, 4 and 8 ranks on a small GPT (L4 H4 C256 T128 V256, 4 sequences a
micro-batch, one thread per rank). For each: `dtrain train` for a few
steps (the mean of the logged step times after the first --skip), then
`dtrain simulate` of the same layout with the compute rate measured here
just before (`--flops-per-s measure`: a layer timed on the cores a rank
gets; when the ranks outnumber the cores, on one core, with the cores
shared among the ranks computing at each instant) and this machine's link
model (the built-in one, or with --calibrate one measured first by `dtrain
bench comm --calibrate`). Prints simulated against measured, the ratio,
and the simulator's breakdown; the target is a ratio within 0.75..1.25.

  python3 bench/bench_simulate.py [--dtrain build/dtrain] [--steps 6] [--skip 2]
                                  [--ranks 2,4,8] [--calibrate]

Runs with more ranks than cores are marked "over": the ranks share the
cores. Other work on the machine slows the real runs and not the
simulation, so before each case the script waits (up to a minute) for the
CPUs to be idle and prints, as "busy", the share of them that other
processes were using at the start.

--scale: the simulator alone, all-reduces from 16 to 4096 ranks (one host
each): ring's time for 256 MiB stays about flat in the rank count, and for
a small message rhd's and tree's grow as log p where ring's grows as p.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

MODEL = ["--n-layer", "4", "--n-head", "4", "--n-embd", "256", "--block-size", "128",
         "--vocab-size", "256", "--batch-size", "4"]
CASES = (("DDP", 1, []),
         ("ZeRO-3", 1, ["--zero-stage", "3"]),
         ("1F1B pp 2", 2, ["--pp", "2", "--pp-schedule", "1f1b", "--grad-accum", "4",
                           "--batch-size", "2"]),
         ("tp 2", 2, ["--tp", "2"]))


def args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(bc.ROOT, "build", "dtrain"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the mean")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--calibrate", action="store_true",
                    help="measure the link model here first (dtrain bench comm --calibrate)")
    ap.add_argument("--scale", action="store_true",
                    help="only the simulator's all-reduces from 16 to 4096 ranks")
    return ap.parse_args()


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ,
                                                                     OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-3000:]))
    return r.stdout


def measured(a, data, tmp, n, flags):
    log = os.path.join(tmp, "log.json")
    if os.path.exists(log):
        os.remove(log)
    run([a.dtrain, "train", "--data", data, "--steps", str(a.steps), "--eval-batches", "0",
         "--shuffle", "0", "--lr-schedule", "constant", "--print-every", "1000000",
         "--log-json", log, "--nproc", str(n), "--threads", "1"] + MODEL + flags)
    ms, = bc.log_means(log, a.skip, "ms")
    return ms


def simulated(a, links, n, flags):
    out = run([a.dtrain, "simulate", "--layout", "--ranks", str(n), "--ranks-per-node", str(n),
               "--flops-per-s", "measure", "--link-model", links] + MODEL + flags)
    step = float(re.search(r"^step\s+([0-9.]+) ms", out, re.M).group(1))
    rate = float(re.search(r"measured: ([0-9.e+]+) FLOP/s", out).group(1))
    split = re.search(r"mean rank\s+compute\s+([0-9.]+) ms.*exposed comm\s+([0-9.]+) ms.*"
                      r"idle\s+([0-9.]+) ms", out)
    return step, rate, [float(x) for x in split.groups()]


def scale(a):
    """All-reduce times in the simulator alone, 16 to 4096 ranks."""
    def us(algo, size, p):
        out = run([a.dtrain, "simulate", "--collective", "allreduce", "--bytes", str(size),
                   "--ranks", str(p), "--algo", algo])
        return float(re.search(r"^simulated\s+([0-9.]+) us", out, re.M).group(1))
    print("%6s %16s %14s %14s %14s" % ("ranks", "ring 256M (ms)", "ring small us",
                                        "rhd small us", "tree small us"))
    for p in (16, 64, 256, 1024, 4096):
        print("%6d %16.2f %14.1f %14.1f %14.1f" % (p, us("ring", 256 << 20, p) / 1e3,
                                                   us("ring", 4 * p, p), us("rhd", 4 * p, p),
                                                   us("tree", 4 * p, p)))


def main():
    a = args()
    bc.print_machine(a.dtrain)
    if a.scale:
        return scale(a)
    cores = os.cpu_count()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        bc.write_corpus(data, 128 * 4 * 8 * (a.steps + 2))
        links = bc.calibrate_links(a.dtrain, tmp) if a.calibrate else "builtin"
        print("GPT L4 H4 C256 T128 V256, 4 x 128 tokens a rank a step, %d steps (mean of the "
              "last %d), one thread a rank, %d cores; links %s" % (
                  a.steps, a.steps - a.skip, cores,
                  "calibrated here" if a.calibrate else "built-in"))
        print("%-10s %5s %5s %6s %12s %13s %7s %11s %22s" % (
            "layout", "ranks", "cores", "busy", "measured ms", "simulated ms", "ratio",
            "GFLOP/s", "sim compute/comm/idle"))
        worst = 1.0
        for name, width, flags in CASES:
            for n in [int(x) for x in a.ranks.split(",")]:
                if n % width:
                    continue
                load = bc.quiet()
                ms = measured(a, data, tmp, n, flags)
                sim, rate, split = simulated(a, links, n, flags)
                ratio = sim / ms
                worst = max(worst, ratio, 1 / ratio)
                print("%-10s %5d %5s %6.2f %12.1f %13.1f %7.2f %11.1f %22s" % (
                    name, n, "over" if n > cores else str(n), load, ms, sim, ratio, rate / 1e9,
                    "/".join("%.0f" % x for x in split)))
        print("worst ratio %.2f (target: within 1.25 either way)" % worst)


if __name__ == "__main__":
    main()
