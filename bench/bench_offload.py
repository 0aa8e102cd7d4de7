"""The optimizer state on NVMe (--offload-optimizer nvme) beside the state
in memory, on GPT-2 small (124M) at 2 ranks with ZeRO-3 (fp32 AdamW,
batch 1 x 256, one thread per rank), in one invocation:

1. The disk under --nvme-path (dtrain's start-up measure: 256 MiB
   sequential, O_DIRECT).
2. Step time in memory and offloaded, and their ratio (the issue's target:
   at most 1.3x), with the step's I/O: bytes, and the time the step
   waited for the disk. Offloaded twice: as dtrain runs it, each layer's
   update deferred into the next forward (--offload-overlap), and with the
   whole update after backward (--offload-overlap 0).
3. How busy the stream keeps the disk, from the run whose stream runs
   alone (--offload-overlap 0): both ranks' bytes read and written in the
   optimizer step against the time the disk's measured read and write
   bandwidths need for them (the issue's target: at least 70%).
4. The largest GPT-2 preset whose plan fits this machine's memory at 2
   ranks (batch 1 x 64, dtrain's --dry-run plan with 10% and 256 MiB a
   rank of margin) for DDP, ZeRO-3, and ZeRO-3 with the optimizer offloaded.

  python3 bench/bench_offload.py [--steps N] [--skip K] [--nvme-path DIR]

(--nvme-path: the directory to stream from, default a temporary one under
/var/tmp; --skip: the first steps left out, default 1, which also drops
the deferred run's first step, whose stream ends in the second.) No peer runs: DeepSpeed's NVMe offload needs its CUDA build.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402
from bench_zero import mem_available_mib, predicted_mib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "dtrain"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=1)
    ap.add_argument("--nvme-path", default=None)
    return ap.parse_args()


def run(a, data, log, extra):
    cmd = [a.dtrain, "train", "--model", "gpt2", "--data", data, "--nproc", "2", "--zero-stage",
           "3", "--batch-size", "1", "--block-size", "256", "--steps", str(a.steps),
           "--eval-batches", "0", "--threads", "1", "--print-every", "1", "--log-json", log] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-3000:]))
    steps = [json.loads(l) for l in open(log) if '"loss"' in l][a.skip:]
    return steps, r.stdout


def mean(xs):
    return sum(xs) / len(xs)


def capacity(a, data, nvme):
    avail = mem_available_mib()
    print("\n4. The largest preset whose plan fits at 2 ranks (fp32 AdamW, batch 1 x 64), "
          "%.1f GiB available" % (avail / 1024))
    print("| strategy | largest preset | predicted per rank (MiB) |")
    print("|---|---|---|")
    rows = (("DDP", []), ("ZeRO-3", ["--zero-stage", "3"]),
            ("ZeRO-3 + NVMe optimizer", ["--zero-stage", "3", "--offload-optimizer", "nvme",
                                         "--nvme-path", nvme]))
    for name, flags in rows:
        best = None
        for preset in PRESETS:
            pred = predicted_mib(a.dtrain, preset, flags + ["--nproc", "2"], data)
            if 2 * (1.1 * pred + 256) <= avail:
                best = (preset, pred)
        print("| %s | %s | %s |" % (name, best[0] if best else "none",
                                    "%.0f" % best[1] if best else "-"))


def main():
    a = parse_args()
    bc.print_machine(a.dtrain)
    nvme = a.nvme_path or tempfile.mkdtemp(prefix="dtrain_bench_nvme_", dir="/var/tmp")
    tmp = tempfile.mkdtemp(prefix="dtrain_bench_offload_")
    data = os.path.join(tmp, "data.txt")
    bc.write_corpus(data, (a.steps + 2) * 2 * 257 * 2)
    print("GPT-2 small, 2 ranks, ZeRO-3, fp32 AdamW, batch 1 x 256, %d steps (the first %d "
          "left out), 1 thread per rank; --nvme-path %s" % (a.steps, a.skip, nvme))
    mem, _ = run(a, data, os.path.join(tmp, "mem.json"), [])
    off, out = run(a, data, os.path.join(tmp, "off.json"),
                   ["--offload-optimizer", "nvme", "--nvme-path", nvme])
    alone, _ = run(a, data, os.path.join(tmp, "alone.json"),
                   ["--offload-optimizer", "nvme", "--nvme-path", nvme, "--offload-overlap", "0"])
    disk = re.search(r"sequential write (\d+) MB/s, read (\d+) MB/s", out)
    wbw, rbw = float(disk.group(1)) * 1e6, float(disk.group(2)) * 1e6
    print("\n1. disk: sequential write %.0f MB/s, read %.0f MB/s" % (wbw / 1e6, rbw / 1e6))
    ms_mem, ms_off = mean([s["ms"] for s in mem]), mean([s["ms"] for s in off])
    ms_alone = mean([s["ms"] for s in alone])
    io_bytes, io_wall = mean([s["io_bytes"] for s in alone]), mean([s["io_wall_ms"] for s in alone])
    print("\n2. step time: in memory %.0f ms, offloaded %.0f ms: %.2fx (target at most 1.3x: %s)"
          % (ms_mem, ms_off, ms_off / ms_mem, "met" if ms_off <= 1.3 * ms_mem else "NOT met"))
    print("   each layer's update deferred into the next forward: %.0f MB a rank streamed, "
          "%.0f ms of the step waiting for the disk" %
          (mean([s["io_bytes"] for s in off]) / 1e6, mean([s["io_ms"] for s in off])))
    print("   the whole update after backward (--offload-overlap 0): %.0f ms, %.2fx; its stream "
          "%.0f MB in %.0f ms, %.0f ms of it waiting for the disk" %
          (ms_alone, ms_alone / ms_mem, io_bytes / 1e6, io_wall,
           mean([s["io_ms"] for s in alone])))
    # Both ranks stream at once: half the bytes are read, half written.
    need_s = 2 * (io_bytes / 2 / rbw + io_bytes / 2 / wbw)
    busy = need_s / (io_wall * 1e-3)
    print("\n3. the disk's share: both ranks' %.0f MB need %.0f ms at the measured bandwidths; "
          "the stream took %.0f ms: %.0f%% (target at least 70%%: %s)" %
          (2 * io_bytes / 1e6, need_s * 1e3, io_wall, 100 * busy,
           "met" if busy >= 0.7 else "NOT met"))
    capacity(a, data, nvme)


if __name__ == "__main__":
    main()
