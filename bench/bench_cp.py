"""Context parallelism beside one rank on long sequences (GPT L4 H6 C384,
batch 1, one thread per rank, the same sequences every step):

1. Speed: one process, then --cp 2 with ring attention (zig-zag), at
   T = 4096: tokens/s of each and the ratio. The issue's target: at least
   1.6x one rank.
2. Ulysses against ring at cp 2 for T = 1024, 4096 and 16384: tokens/s and
   the bytes each rank sent per step (the transport's count), beside the
   attention's bytes by formula, per layer and step
     ring     (3N - 2) B (T/N) 2C floats: N - 1 key/value hops forward,
              N - 1 backward and N hops of their gradients
     Ulysses  4 all-to-alls (q k v and the output forward, their gradients
              backward) sending (N - 1)/N of B (T/N) 8C floats
   and the rest, the gradients' all-reduce, which must come out the same
   for both algorithms (it is checked).
3. Memory: the longest sequence (a multiple of 1024) whose planned
   per-rank state and activations fit a fixed budget (one process's at
   T = 2048), for cp 1, 2 and 4 (dtrain's plan, --dry-run, which the
   tests hold to the run's own accounting); then the longest one trained
   for one step at cp 2 to show it fits (the run's measured peak).

  python3 bench/bench_cp.py [--steps N] [--skip K] [--quick]

(--quick leaves out T = 16384.) No peer runs here: Megatron's context
parallelism and DeepSpeed-Ulysses need GPUs (NCCL), and Debian's PyTorch
1.13 has no context-parallel API.
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

L, H, C, B = 4, 6, 384, 1


def base_args(a, data, T, steps):
    return [a.dtrain, "train", "--data", data, "--n-layer", str(L), "--n-head", str(H),
            "--n-embd", str(C), "--block-size", str(T), "--batch-size", str(B), "--steps",
            str(steps), "--eval-batches", "0", "--shuffle", "0", "--lr-schedule", "constant",
            "--print-every", "1000000", "--threads", "1"]


def run(a, data, tmp, name, T, extra, steps=None):
    steps = steps or a.steps
    log = os.path.join(tmp, name + ".json")
    cmd = base_args(a, data, T, steps) + ["--log-json", log] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-2000:]))
    skip = min(a.skip, steps - 1)
    tps, sent = bc.log_means(log, skip, "tokens_per_s", "bytes_sent")
    return tps, sent, r.stdout


def attention_bytes(algo, n, T):
    rows = B * T // n
    if algo == "ring":
        return L * (3 * n - 2) * rows * 2 * C * 4
    return L * (n - 1) / n * rows * 8 * C * 4


def speed(a, data, tmp):
    T = 4096
    one, _, _ = run(a, data, tmp, "one", T, [])
    cp, sent, _ = run(a, data, tmp, "cp2", T, ["--nproc", "2", "--cp", "2"])
    print("\n1. T %d: one rank %.1f tok/s, cp 2 ring %.1f tok/s: %.2fx (%.1f MB sent per step "
          "per rank)" % (T, one, cp, cp / one, sent / 1e6))
    print("target: cp 2 ring at least 1.6x one rank: %s (%.2fx)" %
          ("met" if cp >= 1.6 * one else "NOT met", cp / one))


def algorithms(a, data, tmp):
    print("\n2. cp 2, ring against Ulysses (bytes per rank per step; attention's by formula)")
    print("%7s %-8s %10s %14s %16s %18s" % ("T", "algo", "tok/s", "MB sent", "attention MB",
                                           "the rest (grads)"))
    lengths = [1024, 4096] + ([] if a.quick else [16384])
    for T in lengths:
        rest = []
        for algo in ("ring", "ulysses"):
            steps = a.steps if T < 16384 else min(a.steps, 3)
            tps, sent, _ = run(a, data, tmp, "%s%d" % (algo, T), T,
                               ["--nproc", "2", "--cp", "2", "--cp-algo", algo], steps)
            att = attention_bytes(algo, 2, T)
            rest.append(sent - att)
            print("%7d %-8s %10.1f %14.2f %16.2f %18.2f" % (T, algo, tps, sent / 1e6, att / 1e6,
                                                           (sent - att) / 1e6))
        same = abs(rest[0] - rest[1]) <= 0.01 * max(rest)
        print("%7s the rest agrees between the algorithms: %s (%.3f vs %.3f MB)" %
              ("", "yes" if same else "NO", rest[0] / 1e6, rest[1] / 1e6))


def planned_total(a, data, T, cp):
    cmd = base_args(a, data, T, 1) + ["--dry-run"]
    if cp > 1:
        cmd += ["--nproc", str(cp), "--cp", str(cp)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-2000:]))
    m = re.search(r"state \+ acts ([0-9.]+) MiB", r.stdout)
    if m:
        return float(m.group(1))
    # One process prints the ZeRO table: its MiB row's last column.
    return float(re.search(r"^  MiB(?:\s+[0-9.]+){5}\s+([0-9.]+)", r.stdout, re.M).group(1))


def memory(a, data, tmp):
    budget = planned_total(a, data, 2048, 1)
    print("\n3. budget: %.1f MiB per rank (one process's plan at T = 2048)" % budget)
    longest = {}
    for cp in (1, 2, 4):
        T = 1024
        while T + 1024 <= 65536 and planned_total(a, data, T + 1024, cp) <= budget:
            T += 1024
        longest[cp] = T
        print("  cp %d: longest T in the budget %6d (plan %.1f MiB)" %
              (cp, T, planned_total(a, data, T, cp)))
    grows = longest[1] < longest[2] < longest[4]
    print("  the longest sequence grows with cp: %s" % ("yes" if grows else "NO"))
    T = longest[2]
    _, _, out = run(a, data, tmp, "fit", T, ["--nproc", "2", "--cp", "2"], steps=1)
    peak = out.split("peak memory per rank")[-1]
    totals = [float(x) for x in re.findall(r"total ([0-9.]+) MiB", peak)]
    print("  cp 2 at T = %d trained one step: measured peak state + acts per rank %s MiB "
          "(budget %.1f): %s" % (T, totals, budget, "fits" if totals and max(totals) <= budget
                                 * 1.02 else "DOES NOT FIT"))


def main():
    a = bc.parse_args([("--quick", "leave out T = 16384")])
    bc.print_machine(a.dtrain)
    a.steps = a.steps if a.steps != 12 else 4
    a.skip = min(a.skip, a.steps - 1) if a.skip != 2 else 1
    tmp = tempfile.mkdtemp(prefix="dtrain_bench_cp_")
    data = os.path.join(tmp, "data.txt")
    bc.write_corpus(data, (a.steps + 2) * B * (65536 + 1) * 2)
    print("GPT L%d H%d C%d, batch %d, %d steps (the first %d left out), 1 thread per rank"
          % (L, H, C, B, a.steps, a.skip))
    speed(a, data, tmp)
    algorithms(a, data, tmp)
    memory(a, data, tmp)


if __name__ == "__main__":
    main()
