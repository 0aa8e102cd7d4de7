"""The Llama family's training throughput: dtrain's against the same model
in PyTorch and against dtrain's GPT-2 of the same width, in one invocation.

  python3 bench/bench_llama.py [--dtrain build/dtrain] [--steps 12] [--skip 2] [--no-install]

Model: the `bench` preset's sizes (L6 H6 C384 T256 V256, batch 8), fp32,
AdamW with clipping at 1, as the Llama family: 2 key/value heads (groups
of 3), SwiGLU 1024 wide (8 C / 3 rounded up to 256), rotary positions,
RMSNorm, untied head. The PyTorch model is tests/pylib/llama_ref.py's,
written from the definitions (torch.nn.Linear products, repeat_interleave
for the key/value heads, the rotary turn by cos/sin tables). Every run is
a process of its own on one pinned core with one thread (bench_moe.py's
machinery: tokens per second of the wall clock and of the process's CPU
time; ratios from the CPU-time rates, which a shared machine disturbs
less). Targets (the project's issue): dtrain >= 1.3x PyTorch's tokens/s,
and MFU within 5 points of dtrain's GPT-2 on the same CPU. Nothing here
is a unit test.
"""
import json
import os
import sys
import tempfile

from bench_common import (B, C, H, L, PYLIB, T, TORCH_PYTHON, V, check_peer, parse_args, quiet,
                          write_corpus)
from bench_moe import dtrain_run, row, run_cpu

KV, FFN = 2, 1024
LLAMA = ["--arch", "llama", "--n-kv-head", str(KV), "--ffn-hidden-size", str(FFN)]

TORCH = r"""
import sys, time, json
import numpy as np, torch
sys.path.insert(0, %(pylib)r)
from dtrain_ref import param_groups
from llama_ref import Llama
torch.set_num_threads(1)
torch.manual_seed(0)
model = Llama(%(L)d, %(H)d, %(KV)d, %(C)d, %(V)d, %(F)d)
model.init_random(torch.Generator().manual_seed(0))
opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3)
data = np.frombuffer(open(%(data)r, "rb").read(), dtype=np.uint8).astype(np.int64)
times, cpu = [], []
for s in range(%(steps)d):
    t0, c0 = time.perf_counter(), time.process_time()
    k = s * %(B)d * %(T)d
    x = torch.from_numpy(data[k:k + %(B)d * %(T)d].reshape(%(B)d, %(T)d))
    y = torch.from_numpy(data[k + 1:k + 1 + %(B)d * %(T)d].reshape(%(B)d, %(T)d))
    opt.zero_grad(set_to_none=True)
    model(x, y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
tps = [%(B)d * %(T)d / t for t in times[%(skip)d:]]
n = (%(steps)d - %(skip)d) * %(B)d * %(T)d
print(json.dumps({"wall": sum(tps) / len(tps), "cpu": n / sum(cpu[%(skip)d:])}))
"""


def torch_run(data, steps, skip):
    script = TORCH % dict(pylib=PYLIB, L=L, H=H, KV=KV, C=C, V=V, F=FFN, T=T, B=B, data=data,
                          steps=steps, skip=skip)
    out, _ = run_cpu([TORCH_PYTHON, "-c", script])
    r = json.loads(out.strip().splitlines()[-1])
    return r["wall"], r["cpu"]


def main():
    a = parse_args()
    probe, peaks, _ = check_peer(a)
    busy = quiet()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        write_corpus(data, B * T * (a.steps + 2))
        g_wall, g_cpu, g_mfu = dtrain_run(a.dtrain, data, a.steps, a.skip, tmp, "gpt2", [])
        l_wall, l_cpu, l_mfu = dtrain_run(a.dtrain, data, a.steps, a.skip, tmp, "llama", LLAMA)
        p_wall, p_cpu = torch_run(data, a.steps, a.skip)
    print("\nLlama family L%d H%d KV%d C%d SwiGLU %d T%d V%d, batch %d, fp32, AdamW; GPT-2 of "
          "the same sizes; 1 thread; %d steps, mean of the last %d; machine %.0f%% busy before"
          % (L, H, KV, C, FFN, T, V, B, a.steps, a.steps - a.skip, 100 * busy))
    print("PyTorch %s on %s, 1 thread; MFU against dtrain's measured fp32 peak, %.1f GFLOP/s "
          "per thread (%s); ratios of the CPU-time rates\n"
          % (probe["version"], probe["blas"], peaks["fp32"][0], peaks["fp32"][1]))
    print("%-28s %9s %9s %7s   %-14s %7s %8s" % ("run", "tok/s", "tok/CPU-s", "MFU", "against",
                                               "ratio", "target"))
    g_mfu, l_mfu = g_mfu * g_cpu / g_wall, l_mfu * l_cpu / l_wall  # at the CPU-time rate
    row("dtrain GPT-2", g_wall, g_cpu, g_mfu)
    row("dtrain Llama", l_wall, l_cpu, l_mfu)
    row("PyTorch Llama", p_wall, p_cpu, l_mfu * p_cpu / l_cpu)
    row("dtrain Llama", l_wall, l_cpu, l_mfu, "PyTorch Llama", l_cpu / p_cpu, 1.3)
    print("MFU: Llama %.1f%%, GPT-2 %.1f%%: %.1f points apart (target: within 5)"
          % (100 * l_mfu, 100 * g_mfu, 100 * (g_mfu - l_mfu)))


if __name__ == "__main__":
    sys.exit(main())
