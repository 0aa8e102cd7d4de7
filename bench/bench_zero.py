"""ZeRO throughput and memory: dtrain's ZeRO stages 1-3 against its DDP, and
ZeRO-1 against PyTorch's ZeroRedundancyOptimizer with DDP (gloo), one run.

  python3 bench/bench_zero.py [--dtrain build/dtrain] [--steps 12] [--skip 2]
                              [--gpt2 [--bf16]] [--capacity]

Speed, on the reference configuration (GPT L6 H6 C384 T256 V256, batch 8
per rank, fp32 AdamW, 2 ranks, one thread each, each rank pinned to its own
core): tokens/s of dtrain DDP and ZeRO-1, -2, -3 (targets: stages 1 and 2
at least 0.95x DDP, stage 3 at least 0.85x), and PyTorch DDP with
ZeroRedundancyOptimizer (target: dtrain ZeRO-1 at least 1.5x).

--gpt2: the same table on GPT-2 small (124M, batch 1 x T 256), with each
rank's peak RSS; with --bf16 also in bf16 mixed precision, with fp32 and
with bf16 gradient accumulation. --capacity: for each GPT-2 preset, which of DDP and the
stages train at 2 ranks (fp32, batch 1, T 64) within this machine's
memory: each is run when dtrain's own prediction (--dry-run) says it fits
in the available memory, and its measured peak RSS printed; otherwise the
prediction is printed and the run left out (an out-of-memory kill would
take other processes with it).
"""
import os
import re
import subprocess
import sys
import tempfile

from bench_common import (B, C, H, L, T, V, check_peer, dtrain_cmd, log_means, parse_args,
                          torch_train, write_corpus)

# ZeroRedundancyOptimizer takes one parameter list: decay on matrices only
# is not expressible, so every parameter decays (the same FLOPs).
ZERO_WRAP = """
from torch.distributed.optim import ZeroRedundancyOptimizer
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3,
                              weight_decay=0.01)
"""


def torch_zero(n, data, steps, skip):
    return torch_train("PyTorch ZeroRedundancyOptimizer", ZERO_WRAP, n, data, steps, skip, 29519)


def peak_rss(stdout):
    """The largest per-rank peak RSS (MiB) in the run's memory table."""
    rss = [float(x) for x in re.findall(r"peak RSS ([0-9.]+)", stdout.split("peak memory")[-1])]
    return max(rss) if rss else float("nan")


def dtrain_run(dtrain, cmd):
    r = subprocess.run(["taskset", "-c", "0,1"] + cmd, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        sys.exit("dtrain failed (%s):\n%s" % (" ".join(cmd), r.stderr[-3000:]))
    return r.stdout


STAGES = (("DDP", []), ("ZeRO-1", ["--zero-stage", "1"]), ("ZeRO-2", ["--zero-stage", "2"]),
          ("ZeRO-3", ["--zero-stage", "3"]))


def speed(a, tmp, data):
    print("\nGPT L%d H%d C%d T%d V%d, batch %d per rank, fp32 AdamW, 2 ranks x 1 thread"
          % (L, H, C, T, V, B))
    res = {}
    for name, flags in STAGES:
        log = os.path.join(tmp, name + ".json")
        dtrain_run(a.dtrain, dtrain_cmd(a.dtrain, data, a.steps, log, "--threads", "1",
                                        "--nproc", "2", *flags))
        res[name] = log_means(log, a.skip, "tokens_per_s", "comm_exposed_ms", "comm_ms")
    pt = torch_zero(2, data, a.steps, a.skip)
    targets = {"ZeRO-1": 0.95, "ZeRO-2": 0.95, "ZeRO-3": 0.85}
    print("%-8s %12s %10s %16s %18s" % ("", "tok/s", "of DDP", "exposed comm",
                                        "rank 0 waited"))
    for name, _ in STAGES:
        tps, comm, waited = res[name]
        t = " (target %.2fx)" % targets[name] if name in targets else ""
        print("%-8s %12.0f %9.2fx %13.1f ms %15.1f ms%s"
              % (name, tps, tps / res["DDP"][0], comm, waited, t))
    print("exposed comm: the least any rank waited a step (comm_exposed_ms); a rank's wait "
          "beyond it was for the other rank's compute")
    print("PyTorch DDP + ZeroRedundancyOptimizer: %.0f tok/s; dtrain ZeRO-1 / PyTorch: %.2fx "
          "(target 1.5x)" % (pt, res["ZeRO-1"][0] / pt))


PRECISIONS = (("fp32", []), ("bf16", ["--dtype", "bf16"]),
              ("bf16, bf16 accumulation", ["--dtype", "bf16", "--grad-accum-dtype", "bf16"]))


def gpt2_table(a, tmp, data):
    precs = PRECISIONS if a.bf16 else PRECISIONS[:1]
    print("\nGPT-2 small (124M), batch 1 x T 256 per rank, AdamW, 2 ranks x 1 thread")
    print("| strategy | " + " | ".join("%s tok/s | %s peak RSS per rank (MiB)" % (p, p)
                                      for p, _ in precs) + " |")
    print("|---|" + "---|---|" * len(precs))
    for name, flags in STAGES:
        cells = []
        for prec, pflags in precs:
            log = os.path.join(tmp, "g%s%s.json" % (name, len(cells)))
            cmd = [a.dtrain, "train", "--model", "gpt2", "--data", data, "--steps", "4",
                   "--batch-size", "1", "--seq-len", "256", "--eval-batches", "0",
                   "--threads", "1", "--nproc", "2", "--print-every", "1000",
                   "--log-json", log] + flags + pflags
            out = dtrain_run(a.dtrain, cmd)
            tps, = log_means(log, 1, "tokens_per_s")
            cells.append("%.0f | %.0f" % (tps, peak_rss(out)))
        print("| %s | %s |" % (name, " | ".join(cells)))


PRESETS = ("gpt2-xl", "gpt2-large", "gpt2-medium", "gpt2")
CAP_FLAGS = ["--nproc", "2", "--batch-size", "1", "--seq-len", "64"]


def predicted_mib(dtrain, preset, flags, data):
    """dtrain's own prediction of a rank's memory: the plan's total
    (model state and activations) plus its transient windows."""
    r = subprocess.run([dtrain, "train", "--dry-run", "--model", preset, "--data", data] +
                       CAP_FLAGS + flags, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("dtrain --dry-run failed:\n" + r.stderr[-2000:])
    mib_row = [l for l in r.stdout.splitlines() if l.strip().startswith("MiB")][0]
    total = float(mib_row.split()[-1])
    return total + sum(float(x) for x in re.findall(r"at most ([0-9.]+) MiB", r.stdout))


def mem_available_mib():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def capacity(a, tmp, data):
    """The largest preset each strategy trains at 2 ranks here. A run is
    tried only when the prediction, with 10% and 256 MiB a rank for the
    process itself, fits in the available memory."""
    avail = mem_available_mib()
    print("\nCapacity at 2 ranks (fp32 AdamW, batch 1 x 64), %.1f GiB available" % (avail / 1024))
    print("| strategy | largest preset that trains | predicted per rank (MiB) | peak RSS per rank (MiB) |")
    print("|---|---|---|---|")
    for name, flags in STAGES:
        for preset in PRESETS:
            pred = predicted_mib(a.dtrain, preset, flags, data)
            if 2 * (1.1 * pred + 256) > avail:
                print("| %s | %s: does not fit (2 x %.0f MiB predicted) | | |" % (name, preset, pred))
                continue
            cmd = [a.dtrain, "train", "--model", preset, "--data", data, "--steps", "1",
                   "--eval-batches", "0", "--threads", "1", "--print-every", "1000"] + CAP_FLAGS + flags
            out = dtrain_run(a.dtrain, cmd)
            print("| %s | %s | %.0f | %.0f |" % (name, preset, pred, peak_rss(out)))
            break


def main():
    a = parse_args((("--gpt2", "the table on GPT-2 small, with peak RSS"),
                    ("--bf16", "with --gpt2: also bf16 mixed precision, with fp32 and bf16 "
                     "gradient accumulation"),
                    ("--capacity", "the largest preset each strategy trains here")))
    probe, _, _ = check_peer(a)
    print("PyTorch %s on %s" % (probe["version"], probe["blas"]))
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        write_corpus(data, 2 * B * T * (a.steps + 2))
        speed(a, tmp, data)
        if a.gpt2:
            gpt2_table(a, tmp, data)
        if a.capacity:
            capacity(a, tmp, data)


if __name__ == "__main__":
    main()
