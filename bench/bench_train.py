"""Training throughput and memory: dtrain against PyTorch, in one invocation.

  python3 bench/bench_train.py [--dtrain build/dtrain] [--steps 12] [--skip 2]

Configuration: GPT with 6 layers, 6 heads, 384 channels, sequences of 256,
vocabulary 256, batch 8, an AdamW step. PyTorch runs the plain GPT-2 module
of tests/pylib/dtrain_ref.py (minGPT's formulation) in fp32 and under bf16
autocast. Each run is a process of its own with OMP_NUM_THREADS set, pinned
with taskset for one thread; tokens/s is the mean over the steps after the
first `skip`, and peak resident memory is the process's maximum RSS. Prints
each pair and the ratio.

First (bench_common.check_peer) it installs what is missing and checks that
PyTorch multiplies on a real BLAS, naming it: against the reference BLAS it
stops with the fix. Where PyTorch has no fast bf16 product for this CPU, the
bf16 row shows dtrain alone, without a ratio.
"""
import json
import os
import subprocess
import sys
import tempfile

from bench_common import (B, C, H, L, PYLIB, T, TORCH_PYTHON, V, check_peer, dtrain_cmd, log_means,
                          parse_args, write_corpus)

TORCH_SCRIPT = r"""
import sys, time, json
import numpy as np, torch
sys.path.insert(0, %(pylib)r)
from dtrain_ref import GPT, param_groups
torch.manual_seed(0)
steps, skip, bf16 = %(steps)d, %(skip)d, %(bf16)d
model = GPT(%(L)d, %(H)d, %(C)d, %(V)d, %(T)d)
opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3)
data = np.frombuffer(open(%(data)r, "rb").read(), dtype=np.uint8).astype(np.int64)
times = []
for s in range(steps):
    t0 = time.perf_counter()
    k = s * %(B)d * %(T)d
    x = torch.from_numpy(data[k:k + %(B)d * %(T)d].reshape(%(B)d, %(T)d))
    y = torch.from_numpy(data[k + 1:k + 1 + %(B)d * %(T)d].reshape(%(B)d, %(T)d))
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(bf16)):
        _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
tps = [%(B)d * %(T)d / t for t in times[skip:]]
print(json.dumps({"tokens_per_s": sum(tps) / len(tps), "loss": loss.item()}))
"""


def measure(cmd, threads):
    """stdout and the child's max RSS, via GNU time's format on stderr."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cores = ",".join(str(i) for i in range(threads))
    wrapped = ["python3", "-c",
               "import os,resource,subprocess,sys;"
               "r=subprocess.run(sys.argv[1:]);"
               "sys.stderr.write('\\nMAXRSS_KB %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
               "sys.exit(r.returncode)", "taskset", "-c", cores] + cmd
    r = subprocess.run(wrapped, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-3000:]))
    rss = int(r.stderr.rsplit("MAXRSS_KB", 1)[1].split()[0]) / 1024.0
    return r.stdout, rss


def dtrain_run(dtrain, data, dtype, threads, steps, skip, tmp):
    log = os.path.join(tmp, "log-%s-%d.json" % (dtype, threads))
    _, rss = measure(dtrain_cmd(dtrain, data, steps, log, "--dtype", dtype, "--threads",
                                str(threads)), threads)
    tps, mfu = log_means(log, skip, "tokens_per_s", "mfu")
    return tps, rss, mfu


def torch_run(data, bf16, steps, skip):
    script = TORCH_SCRIPT % dict(pylib=PYLIB, steps=steps,
                                 skip=skip, bf16=bf16, L=L, H=H, C=C, V=V, T=T, B=B, data=data)
    out, rss = measure([TORCH_PYTHON, "-c", script], 1)
    return json.loads(out.strip().splitlines()[-1])["tokens_per_s"], rss


def main():
    a = parse_args()
    probe, peaks, bf16_fair = check_peer(a)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        write_corpus(data, B * T * (a.steps + 2))
        print("\nGPT L%d H%d C%d T%d V%d, batch %d, AdamW step; %d steps, mean of the last %d"
              % (L, H, C, T, V, B, a.steps, a.steps - a.skip))
        print("PyTorch %s on %s; dtrain's MFU against %.1f GFLOP/s per thread (fp32), %.1f (bf16)"
              % (probe["version"], probe["blas"], peaks["fp32"][0], peaks["bf16"][0]))
        print("%-26s %12s %12s %7s %8s | %12s %12s" % ("run", "PyTorch tok/s", "dtrain tok/s",
                                                     "ratio", "target", "PyTorch RSS", "dtrain RSS"))
        results = {}
        for dtype, bf16, target in (("fp32", 0, 1.1), ("bf16", 1, 1.3)):
            ours, our_rss, mfu = dtrain_run(a.dtrain, data, dtype, 1, a.steps, a.skip, tmp)
            results[dtype] = ours
            if bf16 and not bf16_fair:
                print("%-26s %12s %12.0f %7s %7.1fx | %12s %9.0f MiB   (dtrain MFU %.0f%%)"
                      % (dtype + ", 1 thread", "-", ours, "-", target, "-", our_rss, 100 * mfu))
                print("  no bf16 ratio: PyTorch's bf16 matmul runs at %.1f GFLOP/s here, %.0f%% of "
                      "this CPU's bf16 peak (%.1f): it has no bf16 kernel for this CPU, and a "
                      "ratio against it would mean nothing"
                      % (probe["bf16"], 100 * probe["bf16"] / peaks["bf16"][0], peaks["bf16"][0]))
                continue
            pt, pt_rss = torch_run(data, bf16, a.steps, a.skip)
            print("%-26s %12.0f %12.0f %6.2fx %7.1fx | %9.0f MiB %9.0f MiB   (dtrain MFU %.0f%%)"
                  % (dtype + ", 1 thread", pt, ours, ours / pt, target, pt_rss, our_rss, 100 * mfu))
        two, _, _ = dtrain_run(a.dtrain, data, "fp32", 2, a.steps, a.skip, tmp)
        print("%-26s %12s %12.0f %6.2fx %7.1fx   (2 threads over 1 thread, dtrain fp32)"
              % ("fp32, 2 threads", "-", two, two / results["fp32"], 1.7))


if __name__ == "__main__":
    main()
