"""A mixture of experts' training throughput: dtrain's against its dense
model and against PyTorch, in one invocation.

  python3 bench/bench_moe.py [--dtrain build/dtrain] [--steps 12] [--skip 2] [--no-install]

Model: the `bench` preset (GPT L6 H6 C384 T256 V256, batch 8), fp32, an
AdamW step with clipping at 1; its MoE twin replaces each MLP with 8
experts of width F = 4 C / 2 = 768 and routes each token to 2 of them, so
a token meets the dense MLP's matrix-product FLOPs (plus the router's E C
weights), with the sequence-wise balance loss at dtrain's default
coefficient (0.01) in both implementations. Every run is a process of its
own on one thread, pinned with taskset (dtrain --threads 1; PyTorch with
torch.set_num_threads(1) on the BLAS it loads, named first), and tokens/s
is the mean over the steps after the first `skip`.

1. dtrain's MoE against dtrain's dense model: tokens/s of both from the
   `dtrain train` logs, and the ratio (target: MoE >= 0.85x dense).
2. The MoE model as a PyTorch user writes it (tests/pylib/moe_ref.py's
   layer with its MLP replaced: top K of the fp32 softmax, tokens sorted
   by expert, one product per expert over its rows, a weighted index_add
   back; forward, backward, AdamW) against dtrain's (target: dtrain >=
   1.5x). PyTorch's dense GPT is timed too, for the cost of experts there.

Two rates per run: tokens per second of the wall clock (dtrain's log, the
PyTorch loop's clock), and tokens per second of the process's own CPU time
over the same steps (PyTorch: time.process_time() per step; dtrain: the
CPU time of a run of `steps` steps less that of a run of `skip` steps, so
start-up and warm-up cancel). On an idle machine the two agree; on a
shared one the wall clock counts the other processes' turns on the core,
so the ratios are taken from the CPU-time rates. MFU is dtrain's (its
log's, against the peak `dtrain bench peak` measures, scaled to the
CPU-time rate); PyTorch's is the same FLOPs per token at its rate.
Nothing here is a unit test: timing belongs to benchmarks.
"""
import json
import os
import resource
import subprocess
import sys
import tempfile

from bench_common import (B, C, H, L, PYLIB, T, TORCH_PYTHON, V, check_peer, dtrain_cmd,
                          log_means, parse_args, quiet, write_corpus)

E, K = 8, 2
FFN = 4 * C // K
MOE_FLAGS = ["--num-experts", str(E), "--moe-router-topk", str(K), "--moe-ffn-hidden-size",
             str(FFN)]
AUX = 0.01  # dtrain's default --moe-aux-loss-coeff

TORCH = r"""
import sys, time, json
import numpy as np, torch, torch.nn.functional as F
sys.path.insert(0, %(pylib)r)
from dtrain_ref import GPT, param_groups
from moe_ref import MoEGPT
torch.set_num_threads(1)
torch.manual_seed(0)
E, K, C, Fw, AUX = %(E)d, %(K)d, %(C)d, %(F)d, %(aux)r


class SortedMoE(torch.nn.Module):
    # Tokens sorted by expert, one product per expert over its rows.
    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(C, E, bias=False)
        self.fc = torch.nn.ModuleList(torch.nn.Linear(C, Fw) for _ in range(E))
        self.proj = torch.nn.ModuleList(torch.nn.Linear(Fw, C) for _ in range(E))

    def forward(self, x):
        B, T, _ = x.shape
        probs = self.router(x).float().softmax(-1)
        top_p, top_i = probs.topk(K, dim=-1)
        w = top_p / top_p.sum(-1, keepdim=True)
        f = E / (K * T) * F.one_hot(top_i, E).sum((1, 2)).float()
        aux = AUX * (f * probs.mean(1)).sum(-1).mean()
        flat_i = top_i.reshape(-1)
        order = flat_i.argsort(stable=True)
        counts = torch.bincount(flat_i, minlength=E).tolist()
        rows = order // K
        xs = x.reshape(B * T, C)[rows].split(counts)
        ys = torch.cat([self.proj[e](F.gelu(self.fc[e](xs[e]), approximate="tanh"))
                        for e in range(E)])
        ys = ys * w.reshape(-1)[order].unsqueeze(1)
        out = torch.zeros(B * T, C).index_add(0, rows, ys)
        return out.view(B, T, C), aux


if %(moe)d:
    model = MoEGPT(%(L)d, %(H)d, C, %(V)d, %(T)d, E, Fw, K)
    for layer in model.h:
        layer.mlp = SortedMoE()
else:
    model = GPT(%(L)d, %(H)d, C, %(V)d, %(T)d)
opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3)
data = np.frombuffer(open(%(data)r, "rb").read(), dtype=np.uint8).astype(np.int64)
times, cpu = [], []
for s in range(%(steps)d):
    t0, c0 = time.perf_counter(), time.process_time()
    k = s * %(B)d * %(T)d
    x = torch.from_numpy(data[k:k + %(B)d * %(T)d].reshape(%(B)d, %(T)d))
    y = torch.from_numpy(data[k + 1:k + 1 + %(B)d * %(T)d].reshape(%(B)d, %(T)d))
    opt.zero_grad(set_to_none=True)
    loss, balance = model(x, y) if %(moe)d else (model(x, y)[1], 0.0)
    (loss + balance).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
tps = [%(B)d * %(T)d / t for t in times[%(skip)d:]]
n = (%(steps)d - %(skip)d) * %(B)d * %(T)d
print(json.dumps({"wall": sum(tps) / len(tps), "cpu": n / sum(cpu[%(skip)d:])}))
"""


def run_cpu(cmd):
    """Runs cmd on one pinned core with one thread; its stdout and CPU
    seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(["taskset", "-c", "0"] + cmd, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-3000:]))
    return r.stdout, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def dtrain_run(dtrain, data, steps, skip, tmp, name, extra):
    """dtrain's tokens/s (wall, CPU time) and its logged MFU (wall)."""
    log, warm_log = (os.path.join(tmp, "log-%s%s.json" % (name, w)) for w in ("", "-warm"))
    _, warm = run_cpu(dtrain_cmd(dtrain, data, skip, warm_log, "--threads", "1", *extra))
    _, full = run_cpu(dtrain_cmd(dtrain, data, steps, log, "--threads", "1", *extra))
    wall, mfu = log_means(log, skip, "tokens_per_s", "mfu")
    return wall, (steps - skip) * B * T / (full - warm), mfu


def torch_run(data, steps, skip, moe):
    """The PyTorch loop's tokens/s (wall, CPU time)."""
    script = TORCH % dict(pylib=PYLIB, E=E, K=K, C=C, F=FFN, aux=AUX, L=L, H=H, V=V, T=T, B=B,
                          data=data, steps=steps, skip=skip, moe=int(moe))
    out, _ = run_cpu([TORCH_PYTHON, "-c", script])
    r = json.loads(out.strip().splitlines()[-1])
    return r["wall"], r["cpu"]


def row(name, wall, cpu, mfu, against="", ratio=None, target=None):
    print("%-40s %9.0f %9.0f %6.1f%%   %-14s %7s %8s" % (
        name, wall, cpu, 100 * mfu, against, "%.2fx" % ratio if ratio else "",
        ">= %.2fx" % target if target else ""))


def main():
    a = parse_args()
    probe, peaks, _ = check_peer(a)
    busy = quiet()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        write_corpus(data, B * T * (a.steps + 2))
        d_wall, d_cpu, d_mfu = dtrain_run(a.dtrain, data, a.steps, a.skip, tmp, "dense", [])
        m_wall, m_cpu, m_mfu = dtrain_run(a.dtrain, data, a.steps, a.skip, tmp, "moe", MOE_FLAGS)
        pm_wall, pm_cpu = torch_run(data, a.steps, a.skip, True)
        pd_wall, pd_cpu = torch_run(data, a.steps, a.skip, False)
    print("\nGPT L%d H%d C%d T%d V%d, batch %d, fp32, AdamW; MoE: E %d, top %d, F %d (dense "
          "MLP 4C = %d), balance loss %g; 1 thread; %d steps, mean of the last %d; machine "
          "%.0f%% busy before" % (L, H, C, T, V, B, E, K, FFN, 4 * C, AUX, a.steps,
                                  a.steps - a.skip, 100 * busy))
    print("PyTorch %s on %s, 1 thread; MFU against dtrain's measured fp32 peak, %.1f GFLOP/s "
          "per thread (%s); ratios of the CPU-time rates\n"
          % (probe["version"], probe["blas"], peaks["fp32"][0], peaks["fp32"][1]))
    print("%-40s %9s %9s %7s   %-14s %7s %8s" % ("run", "tok/s", "tok/CPU-s", "MFU", "against",
                                               "ratio", "target"))
    d_mfu, m_mfu = d_mfu * d_cpu / d_wall, m_mfu * m_cpu / m_wall  # at the CPU-time rate
    row("dtrain dense", d_wall, d_cpu, d_mfu)
    row("dtrain MoE", m_wall, m_cpu, m_mfu, "dtrain dense", m_cpu / d_cpu, 0.85)
    row("PyTorch dense", pd_wall, pd_cpu, d_mfu * pd_cpu / d_cpu)
    row("PyTorch MoE (sorted, a product/expert)", pm_wall, pm_cpu, m_mfu * pm_cpu / m_cpu,
        "PyTorch dense", pm_cpu / pd_cpu)
    row("dtrain MoE", m_wall, m_cpu, m_mfu, "PyTorch MoE", m_cpu / pm_cpu, 1.5)


if __name__ == "__main__":
    main()
