#!/usr/bin/python3
"""PyTorch DDP training with the "dtrain" backend (dtrain_torch) against
gloo: tokens/s, and the communication each step exposes, from PyTorch's
own profiler.

  /usr/bin/python3 bench/bench_torch_ddp.py [--build build] [--steps 12] [--skip 2]
                                            [--rounds 3] [--profiled 3]

The model and loop are bench_train's PyTorch GPT (L6 H6 C384 T256 V256,
batch 8 per rank, fp32 AdamW, clipping at 1), wrapped in
DistributedDataParallel, at 2 ranks, each pinned to its own core with one
thread. A round runs gloo, then dtrain (the order alternates between
rounds, so that drift in the machine's speed falls on both); each run is
two fresh processes. Tokens/s is the mean of the steps after --skip; the
median over the rounds is printed.

After the timed steps each run records --profiled more under
torch.profiler. Every collective appears there as a span from its issue
to its completion ("gloo:all_reduce" for gloo, "dtrain:allreduce" for
dtrain, which passes the same profiling title to PyTorch's Work). The
communication a step exposes is the part of those spans during which the
training thread ran no operator (no aten:: event): the time the step
waited for gradients rather than computing beside them. Both backends are
measured by the same rule.

The final losses of the two backends are printed side by side (they are
bit-identical at 2 ranks: the same additions in the same order).
Timing is of this machine, printed first; nothing here is a unit test.
"""
import argparse
import os
import statistics
import sys
import tempfile

from bench_common import B, C, H, L, ROOT, T, V, print_machine, quiet, torch_train, write_corpus

WRAP = """
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3)
"""

# Run after the timed steps: --profiled more under torch.profiler, and the
# communication they exposed (the module's docstring).
PROFILE = r"""
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    t0 = time.perf_counter()
    for s in range(%(steps)d, %(steps)d + %(profiled)d):
        step(s)
    profiled_s = time.perf_counter() - t0
events = list(prof.events())
main = {e.thread for e in events if e.name == "DistributedDataParallel.forward"}

def union(spans):
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out

comm = union((e.time_range.start, e.time_range.end) for e in events
             if e.name.startswith(%(backend)r + ":"))
busy = union((e.time_range.start, e.time_range.end) for e in events
             if e.thread in main and e.name.startswith("aten::"))
exposed, j = 0.0, 0
for a, b in comm:
    while j < len(busy) and busy[j][1] <= a:
        j += 1
    covered, k = 0.0, j
    while k < len(busy) and busy[k][0] < b:
        covered += min(b, busy[k][1]) - max(a, busy[k][0])
        k += 1
    exposed += (b - a) - covered
result.update(comm_ms=sum(b - a for a, b in comm) / 1e3 / %(profiled)d,
              exposed_ms=exposed / 1e3 / %(profiled)d,
              profiled_step_ms=1e3 * profiled_s / %(profiled)d)
"""


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the means")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profiled", type=int, default=3, help="steps recorded by the profiler")
    return ap.parse_args()


def run(a, backend, data, port):
    pydir = os.path.join(os.path.abspath(a.build), "python")
    after = PROFILE % dict(steps=a.steps, profiled=a.profiled, backend=backend)
    return torch_train("PyTorch DDP on " + backend, WRAP, 2, data, a.steps, a.skip, port,
                       backend=backend, key=None, after=after,
                       imports="sys.path.insert(0, %r)\nimport dtrain_torch" % pydir)


def main():
    a = parse_args()
    if not os.path.isdir(os.path.join(a.build, "python", "dtrain_torch")):
        sys.exit("%s/python/dtrain_torch is missing: build dtrain with PyTorch's headers "
                 "present (docs/pytorch.md)" % a.build)
    if os.cpu_count() < 2:
        sys.exit("2 ranks need 2 cores")
    print_machine(os.path.join(a.build, "dtrain"))
    busy = quiet()
    runs = {"gloo": [], "dtrain": []}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        write_corpus(data, 2 * B * T * (a.steps + a.profiled + 2))
        for r in range(a.rounds):
            order = ("gloo", "dtrain") if r % 2 == 0 else ("dtrain", "gloo")
            for i, backend in enumerate(order):
                runs[backend].append(run(a, backend, data, 29600 + 2 * r + i))
    print("PyTorch DDP, GPT L%d H%d C%d T%d V%d, batch %d per rank, fp32 AdamW, 2 ranks of 1 "
          "thread, median of %d rounds; CPUs %.0f%% busy before the start"
          % (L, H, C, T, V, B, a.rounds, 100 * busy))
    print("%-8s %10s %9s %16s %19s %8s" % ("backend", "tok/s", "step ms", "comm ms/step",
                                          "exposed ms/step", "loss"))
    med = {}
    for backend in ("gloo", "dtrain"):
        rs = runs[backend]
        med[backend] = {k: statistics.median(x[k] for x in rs)
                        for k in ("tokens_per_s", "step_ms", "comm_ms", "exposed_ms",
                                  "profiled_step_ms")}
        m = med[backend]
        print("%-8s %10.0f %9.1f %16.1f %11.1f (%4.1f%%) %.6f"
              % (backend, m["tokens_per_s"], m["step_ms"], m["comm_ms"], m["exposed_ms"],
                 100 * m["exposed_ms"] / m["profiled_step_ms"], rs[-1]["loss"]))
    print("dtrain over gloo: %.2fx the tokens/s; final losses %s"
          % (med["dtrain"]["tokens_per_s"] / med["gloo"]["tokens_per_s"],
             "bit-identical" if runs["dtrain"][-1]["loss"] == runs["gloo"][-1]["loss"]
             else "differ"))
    print("exposed: the part of the collectives' spans in PyTorch's profiler during which the "
          "training thread ran no operator, per step (% of the profiled step)")


if __name__ == "__main__":
    main()
