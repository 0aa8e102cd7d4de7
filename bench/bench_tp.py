"""Tensor parallelism beside one rank on a wide model (GPT L4 H12 C1536,
T 256, batch 4, one thread per rank, the same 4 sequences per step): one
process, then --tp 2 over 2 ranks (each holding half of every matrix).
Prints tokens/s of each, the ratio, the bytes the group sent per step
(the transport's count) beside the formula's, and each rank's parameters
and activations (the run's own accounting, peak MiB).

  python3 bench/bench_tp.py [--steps N] [--skip K]

The issue's target: tp 2 at least 1.6x one rank's tokens/s. No peer runs
here: Megatron's tensor parallelism needs GPUs, and PyTorch's
DTensor-based tensor parallel API is newer than Debian's 1.13.
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

L, H, C, T, B = 4, 12, 1536, 256, 4


def run(a, data, tmp, name, extra):
    log = os.path.join(tmp, name + ".json")
    cmd = [a.dtrain, "train", "--data", data, "--n-layer", str(L), "--n-head", str(H),
           "--n-embd", str(C), "--block-size", str(T), "--batch-size", str(B), "--steps",
           str(a.steps), "--eval-batches", "0", "--shuffle", "0", "--lr-schedule", "constant",
           "--print-every", "1000000", "--threads", "1", "--log-json", log] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-2000:]))
    tps, sent = bc.log_means(log, a.skip, "tokens_per_s", "bytes_sent")
    peak = r.stdout.split("peak memory")[-1]
    # A run of several ranks prints "  rank 0: params 0.1 MiB | ... | acts 0.2 MiB";
    # one process a table whose row is "  rank 0   params x.. grads x.. optim x.. ...".
    mem = re.findall(r"^  rank \d+: params ([0-9.]+) MiB.*?acts ([0-9.]+) MiB", peak, re.M)
    if not mem:
        mem = re.findall(r"^  rank \d+\s+([0-9.]+) x[0-9.]+\s+[0-9.]+ x[0-9.]+\s+[0-9.]+ "
                         r"x[0-9.]+\s+[0-9.]+ x[0-9.]+\s+([0-9.]+)", peak, re.M)
    return tps, sent, mem


def main():
    a = bc.parse_args()
    bc.print_machine(a.dtrain)
    a.steps = a.steps if a.steps != 12 else 4
    a.skip = min(a.skip, a.steps - 1) if a.skip != 2 else 1
    tmp = tempfile.mkdtemp(prefix="dtrain_bench_tp_")
    data = os.path.join(tmp, "data.txt")
    bc.write_corpus(data, (a.steps + 2) * B * (T + 1) * 2)
    print("GPT L%d H%d C%d, T %d, batch %d, %d steps (the first %d left out), 1 thread per rank"
          % (L, H, C, T, B, a.steps, a.skip))
    one, _, mem1 = run(a, data, tmp, "one", [])
    tp, sent, mem2 = run(a, data, tmp, "tp2", ["--nproc", "2", "--tp", "2"])
    N = B * T
    # 4 all-reduces per layer, the embeddings' and the head's, of N C floats;
    # the loss's N floats and 2 N doubles; each sends half its buffer on 2 ranks.
    want = ((4 * L + 2) * N * C * 4 + N * 4 + 2 * N * 8) * 2 * (2 - 1) / 2
    print("%-12s %10s %8s %14s %26s" % ("layout", "tok/s", "x one", "MB sent/step",
                                        "params, acts MiB per rank"))
    print("%-12s %10.1f %8s %14s %26s" % ("one rank", one, "1.00", "-",
                                          ", ".join("%s, %s" % m for m in mem1)))
    print("%-12s %10.1f %8.2f %14.1f %26s" % ("tp 2", tp, tp / one, sent / 1e6,
                                              "; ".join("%s, %s" % m for m in mem2)))
    print("tp 2 bytes sent per step: %.1f MB measured, %.1f MB by the formula (the norm's "
          "sums are the rest)" % (sent / 1e6, want / 1e6))
    print("target: tp 2 at least 1.6x one rank: %s (%.2fx)" %
          ("met" if tp >= 1.6 * one else "NOT met", tp / one))


if __name__ == "__main__":
    main()
