"""Pipeline parallelism beside DDP on the reference configuration (GPT L6
H6 C384 T256, one thread per rank, 2 ranks, the same 16 sequences per
step): DDP with batch 8 per rank, and each schedule at pp 2 with M = 2, 4,
8 micro-batches of 16 / M sequences. Prints tokens/s, the ratio to DDP,
the bubble the formula gives for unit-time forward and backward, the idle
fraction measured from each run's --trace (1 - the computing share,
waiting for messages included), and the activations each stage holds (the
run's own accounting, peak MiB).

  python3 bench/bench_pp.py [--steps N] [--skip K] [--m 2,4,8]

The issue's targets: 1f1b at M = 8 at least 0.85x DDP's tokens/s (the
bubble alone allows 0.89x on two ranks), and zb1p above 1f1b (its weight
halves fill the cool-down that 1f1b spends idle). No peer runs here: PyTorch's
pipeline schedules need torch.distributed.pipelining (PyTorch 2.4), which
Debian's 1.13 lacks.
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def idle_fraction(a, trace):
    """1 - the busy (computing) share, the job's mean over ranks, from the
    trace's steps after the first (`dtrain trace summary`): time spent
    waiting for a message counts as idle, which is what the bubble is."""
    r = subprocess.run([a.dtrain, "trace", "summary", trace], capture_output=True, text=True)
    m = re.search(r"^job\s+[0-9.]+\s+([0-9.]+)", r.stdout, re.M)
    return 1.0 - float(m.group(1)) if m else float("nan")


def run(a, data, tmp, name, nproc, extra):
    log, trace = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".trace.json")
    cmd = bc.dtrain_cmd(a.dtrain, data, a.steps, log, "--nproc", str(nproc), "--threads", "1",
                        "--trace", trace, *extra)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-2000:]))
    tps, = bc.log_means(log, a.skip, "tokens_per_s")
    acts = re.findall(r"rank \d+ \((stage \d+, \d+ in flight)\):.*?acts ([0-9.]+) MiB",
                      r.stdout.split("peak memory per rank")[-1])
    return tps, acts, idle_fraction(a, trace)


def bubble(kind, p, M):
    """Idle / total with unit-time F and B (zb1p: F = I = W), as `dtrain
    plan` prints it."""
    if kind == "naive":
        return 1.0 - 1.0 / p
    if kind == "zb1p":
        x = (p - 1) / (3.0 * M)
        return x / (1 + x)
    return (p - 1) / (M + p - 1)


def main():
    ap_flags = ()
    a = bc.parse_args(ap_flags)
    bc.print_machine(a.dtrain)
    Ms = [2, 4, 8]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        bc.write_corpus(data, bc.T * 16 * (a.steps + 2))
        ddp, _, _ = run(a, data, tmp, "ddp", 2, ["--grad-accum", "1"])
        print("reference: GPT L%d H%d C%d T%d, 16 sequences per step, 2 ranks x 1 thread"
              % (bc.L, bc.H, bc.C, bc.T))
        print("DDP (batch 8 per rank): %.0f tok/s" % ddp)
        print("%-6s %3s %10s %8s %14s %13s  %s" % ("pp 2", "M", "tok/s", "x DDP",
                                                  "bubble formula", "idle (trace)",
                                                  "activations held (peak MiB)"))
        got = {}
        for kind in ("naive", "gpipe", "1f1b", "zb1p"):
            for M in Ms:
                tps, acts, idle = run(a, data, tmp, "%s%d" % (kind, M), 2,
                                ["--pp", "2", "--pp-schedule", kind, "--grad-accum", str(M),
                                 "--batch-size", str(16 // M)])
                got[kind, M] = tps, idle
                print("%-6s %3d %10.0f %8.2f %14.3f %13.3f  %s" % (
                    kind, M, tps, tps / ddp, bubble(kind, 2, M), idle,
                    ", ".join("%s %s" % s for s in acts)))
        for M in Ms:
            (z, zi), (o, oi) = got["zb1p", M], got["1f1b", M]
            print("zb1p / 1f1b at M = %d: %.3fx tokens/s, idle %.3f vs %.3f" % (M, z / o, zi, oi))


if __name__ == "__main__":
    main()
