"""all_reduce from PyTorch: the "dtrain" backend (dtrain_torch) against
gloo, in the same two processes, one invocation.

  python3 bench/bench_torch.py [--build build] [--reps 5] [--max-mib 256]

Two ranks on this machine (torch.multiprocessing, a FileStore), each with a
"dtrain" default group and a gloo group of the same ranks. For each size,
float32 from 64 KiB to --max-mib MiB by factors of 4, and an 8-byte
latency: a warm-up round on each backend, then --reps rounds, each timing
calls back to back on dtrain, then on gloo (alternating which goes first),
so that load from elsewhere falls on both: 200 calls at the smallest
sizes, fewer as they grow (64 MiB of calls, at least 8: with 2 calls
at 4 MiB a round's time moved by 4x from one round to the next, the skew
and the wake-ups of the first call not shared out), the time per call
being the batch's over its calls, so that the ranks' skew leaving the
barrier before it is shared out rather than added to one call; the median
of the rounds is printed, with bus bandwidth (algbw x 2(n-1)/n, as nccl-tests)
and dtrain's time relative to gloo's. The time is the slower rank's, the
call's end to end from Python: what a training loop sees. Every result is
checked against the known sum before anything is printed.

On a machine shared with other work the figures are noisy: the table says
how busy the CPUs were before it started (bench_common.quiet waits up to a
minute for them to calm down). Nothing here is a unit test.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

from bench_common import ROOT, TORCH_PYTHON, print_machine, quiet

NRANKS = 2


def measure(rank, path, sizes, reps, queue, pydir):
    sys.path.insert(0, pydir)
    import torch
    import torch.distributed as dist
    import dtrain_torch  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    dist.init_process_group("dtrain", init_method="file://" + path, rank=rank,
                            world_size=NRANKS)
    gloo = dist.new_group(backend="gloo")
    groups = {"dtrain": None, "gloo": gloo}
    want = float(sum(r + 1 for r in range(NRANKS)))
    rows = []
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        # Back to back, so the ranks' skew leaving the barrier is shared out
        # over the calls rather than added to one.
        calls = max(8, min(200, (64 << 20) // nbytes))
        bufs = {k: torch.empty(n) for k in groups}
        times = {k: [] for k in groups}
        for rnd in range(reps + 1):  # round 0 warms up
            order = list(groups) if rnd % 2 == 0 else list(reversed(list(groups)))
            for k in order:
                bufs[k].fill_(rank + 1)
                dist.all_reduce(bufs[k], group=groups[k])
                if not bool((bufs[k] == want).all()):
                    raise SystemExit("%s all_reduce of %d bytes is wrong" % (k, nbytes))
                bufs[k].zero_()  # sums of zeros stay zero however many calls
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                for _ in range(calls):
                    dist.all_reduce(bufs[k], group=groups[k])
                dt = torch.tensor([(time.perf_counter() - t0) / calls], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)  # the slower rank's
                if rnd:
                    times[k].append(dt.item())
        rows.append((nbytes, {k: statistics.median(v) for k, v in times.items()}))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def human(nbytes):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return "%d %s" % (nbytes // div, unit)
    return "%d B" % nbytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-mib", type=int, default=256)
    args = ap.parse_args()
    pydir = os.path.join(args.build, "python")
    if not os.path.exists(os.path.join(pydir, "dtrain_torch", "__init__.py")):
        sys.exit("no dtrain_torch in %s: build with PyTorch found (-DDTRAIN_WITH_TORCH=ON)"
                 % pydir)
    if os.path.realpath(sys.executable) != os.path.realpath(TORCH_PYTHON):
        os.execv(TORCH_PYTHON, [TORCH_PYTHON] + sys.argv)
    import torch.multiprocessing as mp
    sizes = [8]
    s = 64 << 10
    while s <= args.max_mib << 20:
        sizes.append(s)
        s *= 4
    busy = quiet()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(measure, args=(os.path.join(d, "store"), sizes, args.reps, queue, pydir),
                 nprocs=NRANKS)
    rows = queue.get()
    print_machine(os.path.join(args.build, "dtrain"))
    print("all_reduce of float32 at %d ranks, median of %d rounds; CPUs %.0f%% busy before "
          "the start (other work makes these figures noisy)" % (NRANKS, args.reps, 100 * busy))
    print("%-9s %12s %12s %14s %14s %8s" % ("size", "dtrain us", "gloo us", "dtrain busbw",
                                             "gloo busbw", "ratio"))
    factor = 2.0 * (NRANKS - 1) / NRANKS
    for nbytes, t in rows:
        bw = {k: nbytes / v * factor / 1e9 for k, v in t.items()}
        print("%-9s %12.1f %12.1f %10.2f GB/s %10.2f GB/s %7.2fx" % (
            human(nbytes), t["dtrain"] * 1e6, t["gloo"] * 1e6, bw["dtrain"], bw["gloo"],
            t["gloo"] / t["dtrain"]))
    print("ratio: gloo's time over dtrain's (above 1: dtrain is faster)")


if __name__ == "__main__":
    main()
