"""What the training benchmarks share: the configuration (GPT L6 H6 C384
T256 V256, batch 8), arguments, a corpus file, the dtrain command line,
means over a JSON log, and the check that PyTorch is a fair peer.

A fair peer: PyTorch's matrix products must run on a real BLAS. Debian's
PyTorch calls whatever libblas.so.3 the alternatives system points at, and
on a fresh machine that is the reference BLAS (a few GFLOP/s, against about
100 for OpenBLAS on one core): dtrain would then look tens of times faster
for no merit of its own. So before anything is timed, scripts/deps.sh
installs what is missing (libopenblas0-pthread among it), a PyTorch process
pinned as the benchmark's are says which BLAS it has mapped and how fast it
multiplies 1024 x 1024 matrices (per second of its CPU time, so that other
load on the machine does not count against it), and that rate is set
against this CPU's peak as `dtrain bench peak` measures it. Against a crippled peer no ratio
is printed: the benchmark stops and says how to fix it.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYLIB = os.path.join(ROOT, "tests", "pylib")
TORCH_PYTHON = "/usr/bin/python3"  # Debian's python3-torch
L, H, C, T, V, B = 6, 6, 384, 256, 256, 8
# A peer whose 1024^3 product runs below this share of the CPU's measured
# peak is crippled (the reference BLAS reaches a few %; OpenBLAS 70-90% on
# the cores it knows and ~45% with AVX2 kernels on an AVX-512 core).
FAIR_SHARE = 0.25
OPENBLAS_ALT = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"


def parse_args(flags=(), repeat=False):
    """The benchmarks' common options, and each (flag, help) of `flags` as
    a switch; with repeat, --repeat N (runs of each measurement, whose
    medians the script reports)."""
    ap = argparse.ArgumentParser()
    for flag, help_text in flags:
        ap.add_argument(flag, action="store_true", help=help_text)
    if repeat:
        ap.add_argument("--repeat", type=int, default=1,
                        help="runs of each measurement, interleaved; the medians are reported")
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "dtrain"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the means")
    ap.add_argument("--no-install", action="store_true",
                    help="do not run scripts/deps.sh (stop if PyTorch's BLAS is not fair)")
    a = ap.parse_args()
    if repeat and a.repeat < 1:
        ap.error("--repeat must be at least 1, not %d" % a.repeat)
    return a


def calibrate_links(dtrain, tmp):
    """This machine's link model, measured by `dtrain bench comm --calibrate`
    at 2 ranks: the file's path, for --link-model."""
    path = os.path.join(tmp, "links.json")
    r = subprocess.run([dtrain, "bench", "comm", "--calibrate", path, "--nproc", "2"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("dtrain bench comm --calibrate failed:\n%s" % (r.stdout + r.stderr)[-3000:])
    return path


def busy_share(seconds=0.5):
    """The share of the CPUs in use over `seconds` (/proc/stat)."""
    def sample():
        v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return sum(v), v[3] + v[4]
    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def quiet(limit_s=60):
    """Waits for the machine to be idle (under 10% busy), at most limit_s:
    the share seen first, for the table (a timing taken beside other load
    measures the load)."""
    first = busy_share()
    end, now = time.time() + limit_s, first
    while now > 0.10 and time.time() < end:
        now = busy_share(2.0)
    return first


def cpu_line():
    """The CPU's name and whether it has AVX-512 and AMX (lscpu)."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = re.search(r"^Model name:\s*(.*)$", out, re.M)
    m = re.search(r"^Flags:\s*(.*)$", out, re.M)
    flags = set(m.group(1).split()) if m else set()
    return "CPU: %s, %s cores; avx512f %s, amx %s" % (
        name.group(1) if name else "unknown", os.cpu_count(),
        "yes" if "avx512f" in flags else "no",
        "yes (%s)" % " ".join(sorted(f for f in flags if f.startswith("amx")))
        if any(f.startswith("amx") for f in flags) else "no")


def machine_lines(dtrain):
    """What this machine can do, measured now by `dtrain bench peak`: the
    CPU, the FMA peak of one thread (fp32 and bf16) and the copy
    bandwidth of one thread and of all, as lines to print first, so that
    every figure a benchmark prints can be read against its limit."""
    r = subprocess.run([dtrain, "bench", "peak"], capture_output=True, text=True)
    if r.returncode != 0:
        return [cpu_line(), "(dtrain bench peak failed: %s)" % (r.stdout + r.stderr)[-200:]]
    out = r.stdout

    def best(pattern):
        vals = [float(v) for v in re.findall(pattern, out, re.M)]
        return max(vals) if vals else float("nan")

    f32 = best(r"^fp32 .* loop\s+1\s+([0-9.]+)")
    bf16 = best(r"^bf16 .* loop\s+1\s+([0-9.]+)")
    one = best(r"^\s+1 thread: ([0-9.]+) GB/s")
    allt = best(r"^\s+\d+ threads: ([0-9.]+) GB/s")
    return [cpu_line(),
            "limits (dtrain bench peak): FMA peak of one thread fp32 %.1f GFLOP/s, bf16 %.1f; "
            "memory copy %.1f GB/s on one thread, %.1f on all %d" % (f32, bf16, one, allt,
                                                                     os.cpu_count())]


def print_machine(dtrain):
    for line in machine_lines(dtrain):
        print(line)
    sys.stdout.flush()


def write_corpus(path, ntokens):
    """Random words, at least ntokens bytes: every step reads fresh data."""
    rng = random.Random(0)
    words = ["tok%d" % i for i in range(500)]
    with open(path, "w") as f:
        f.write(" ".join(rng.choice(words) for _ in range(ntokens // 4 + 1)))


def dtrain_cmd(dtrain, data, steps, log, *extra):
    return [dtrain, "train", "--model", "bench", "--data", data, "--steps", str(steps),
            "--batch-size", str(B), "--eval-batches", "0", "--shuffle", "0",
            "--lr-schedule", "constant", "--print-every", "1000000", "--log-json", log] + list(extra)


def log_means(log, skip, *keys):
    """Means of keys over the logged steps after the first `skip`."""
    entries = [json.loads(l) for l in open(log) if '"loss"' in l][skip:]
    return [sum(e.get(k, 0) for e in entries) / len(entries) for k in keys]


# ---- is PyTorch a fair peer? ------------------------------------------------

TORCH_PROBE = r"""
import ctypes, json, os, re, time, torch
def rate(dtype):
    # GFLOP/s per second of the process's CPU time, as dtrain times its
    # peak: a busy machine slows the wall clock, not this.
    a, b = torch.randn(1024, 1024).to(dtype), torch.randn(1024, 1024).to(dtype)
    torch.mm(a, b)
    best, t_end = 0.0, time.perf_counter() + 0.5
    while True:
        t0 = time.process_time()
        torch.mm(a, b)
        dt = time.process_time() - t0
        best = max(best, 2 * 1024 ** 3 / max(dt, 1e-9) / 1e9)
        if time.perf_counter() > t_end:
            return best
def sgemm_provider():
    # The file whose sgemm_ the libblas.so.3 this process loaded resolves
    # to (Debian's torch calls that one); None when none is loaded.
    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
    try:
        blas = ctypes.CDLL("libblas.so.3", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        info = DlInfo()
        if ctypes.CDLL(None).dladdr(ctypes.cast(blas.sgemm_, ctypes.c_void_p), ctypes.byref(info)):
            return os.path.realpath(info.fname.decode())
    except (OSError, AttributeError):
        pass
    return None
f32 = rate(torch.float32)
bf16 = rate(torch.bfloat16)
maps = {l.split()[-1] for l in open("/proc/self/maps") if len(l.split()) >= 6}
libs = sorted(p for p in maps if re.search(r"blas|mkl|blis", os.path.basename(p), re.I))
print(json.dumps({"version": torch.__version__, "threads": torch.get_num_threads(),
                  "f32": f32, "bf16": bf16, "sgemm": sgemm_provider(), "libs": libs}))
"""


def blas_name(libs):
    """Which BLAS the libraries' paths name."""
    for key, name in (("openblas", "OpenBLAS"), ("mkl", "MKL"), ("blis", "BLIS")):
        hits = [p for p in libs if key in p.lower()]
        if hits:
            return name, hits[0]
    ref = [p for p in libs if "/blas/libblas.so" in p]
    if ref:
        return "reference BLAS (netlib)", ref[0]
    other = [p for p in libs if "libblas.so" in p]
    if other:
        return "an unknown libblas", other[0]
    return "no BLAS library mapped", ""


def torch_probe():
    """PyTorch's BLAS and its 1024^3 matmul rates (fp32, bf16) on one pinned
    thread, as the benchmarks run it."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(["taskset", "-c", "0", TORCH_PYTHON, "-c", TORCH_PROBE],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit("PyTorch (%s) failed to run: is python3-torch installed? (bash scripts/deps.sh)\n%s"
                 % (TORCH_PYTHON, r.stderr[-2000:]))
    p = json.loads(r.stdout.strip().splitlines()[-1])
    # The library sgemm_ comes from, else a guess from what is mapped.
    p["blas"], p["blas_path"] = blas_name([p["sgemm"]] if p["sgemm"] else p["libs"])
    return p


def dtrain_peaks(dtrain):
    """This CPU's measured peak per thread, GFLOP/s, for fp32 and bf16 runs
    (what dtrain's MFU is measured against), and how it was measured."""
    env = {k: v for k, v in os.environ.items() if k != "DTRAIN_PEAK_GFLOPS"}
    r = subprocess.run(["taskset", "-c", "0", dtrain, "bench", "peak", "--threads", "1"],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit("dtrain bench peak failed:\n" + r.stdout[-1000:] + r.stderr[-1000:])
    peaks = {}
    for dtype in ("fp32", "bf16"):
        m = re.search(r"^  %s: MFU against a measured peak of ([0-9.]+) GFLOP/s x 1 thread \((.*)\)$"
                      % dtype, r.stdout, re.M)
        if not m:
            sys.exit("dtrain bench peak gave no measured %s peak:\n%s" % (dtype, r.stdout))
        peaks[dtype] = (float(m.group(1)), m.group(2))
    return peaks


def ensure_deps(no_install):
    if no_install:
        return
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "deps.sh")])
    if r.returncode != 0:
        print("(scripts/deps.sh failed: going on with what is installed)", file=sys.stderr)


def openblas_core_for_cpu():
    """The OpenBLAS kernel family for this CPU's widest vectors, as
    OPENBLAS_CORETYPE names it: what a user sets when OpenBLAS does not
    know the CPU model (a CPU newer than the library)."""
    flags = open("/proc/cpuinfo").read()
    if re.search(r"\bavx512f\b", flags) and re.search(r"\bavx512bw\b", flags):
        return "SKYLAKEX"
    if re.search(r"\bavx2\b", flags) and re.search(r"\bfma\b", flags):
        return "HASWELL"
    return None


def name_openblas_core(p, f32_peak):
    """OpenBLAS picks its kernels by the CPU's model number; one it does
    not know (seen: a Xeon of family 6 model 207 under Debian's 0.3.21)
    gets a generic kernel at some 15% of the peak. Then the peer is run as
    its user would run it, with OPENBLAS_CORETYPE naming the kernel family
    the CPU's vectors call for, and the benchmark says so. A type the user
    set is left alone."""
    if (p["blas"] != "OpenBLAS" or p["f32"] >= FAIR_SHARE * f32_peak
            or "OPENBLAS_CORETYPE" in os.environ):
        return p
    core = openblas_core_for_cpu()
    if core is None:
        return p
    os.environ["OPENBLAS_CORETYPE"] = core
    q = torch_probe()
    if q["f32"] <= p["f32"]:
        del os.environ["OPENBLAS_CORETYPE"]
        return p
    print("  OpenBLAS did not recognise this CPU: its fp32 products ran at %.1f GFLOP/s; with "
          "OPENBLAS_CORETYPE=%s (this CPU's vectors' kernels, as its users set it) they run at "
          "%.1f, and every PyTorch run below has it" % (p["f32"], core, q["f32"]))
    return q


def check_peer(a):
    """Installs what is missing, then describes PyTorch's BLAS against the
    CPU's peak; stops when its fp32 products are crippled. Returns
    (probe, peaks, bf16_fair): the bf16 ratio is withheld, not the run
    stopped, when only PyTorch's bf16 products are slow (CPUs where it has
    no bf16 kernel; nothing to install fixes that)."""
    ensure_deps(a.no_install)
    print_machine(a.dtrain)
    peaks = dtrain_peaks(a.dtrain)
    p = torch_probe()
    f32_peak, f32_how = peaks["fp32"]
    bf16_peak, _ = peaks["bf16"]
    p = name_openblas_core(p, f32_peak)
    print("PyTorch %s, BLAS: %s%s" % (p["version"], p["blas"],
                                      " (%s)" % p["blas_path"] if p["blas_path"] else ""))
    print("  1024^3 matmul on 1 thread: fp32 %.1f GFLOP/s = %.0f%% of this CPU's fp32 peak, "
          "bf16 %.1f = %.0f%% of its bf16 peak" % (p["f32"], 100 * p["f32"] / f32_peak, p["bf16"],
                                                   100 * p["bf16"] / bf16_peak))
    print("  peak per thread: fp32 %.1f GFLOP/s, bf16 %.1f (%s)" % (f32_peak, bf16_peak, f32_how))
    crippled = p["blas"].startswith("reference") or p["f32"] < FAIR_SHARE * f32_peak
    if crippled:
        sys.exit(
            "\nNo comparison: PyTorch's matrix products run on %s%s at %.1f GFLOP/s, %.0f%% of "
            "what this CPU does (%.1f); a ratio against that would measure the BLAS, not "
            "dtrain.\nFix: install OpenBLAS (bash scripts/deps.sh, or sudo apt-get install "
            "libopenblas0-pthread); if it is installed, select it:\n  sudo update-alternatives "
            "--set libblas.so.3-x86_64-linux-gnu %s\nthen run this again.%s"
            % (p["blas"], " (%s)" % p["blas_path"] if p["blas_path"] else "", p["f32"],
               100 * p["f32"] / f32_peak, f32_peak, OPENBLAS_ALT,
               "\n(LD_LIBRARY_PATH=%s may be what brings it in.)" % os.environ["LD_LIBRARY_PATH"]
               if os.environ.get("LD_LIBRARY_PATH") else ""))
    bf16_fair = p["bf16"] >= FAIR_SHARE * bf16_peak
    return p, peaks, bf16_fair


# ---- the PyTorch peer's training loop, on n ranks ---------------------------

# One step per iteration on the same data dtrain reads: forward, backward,
# clipping at 1, the optimizer. %(wrap)s builds `ddp` (the module that runs
# forward) and `opt` from `model`.
TORCH_TRAIN = r"""
import os, sys, time, json
import numpy as np, torch, torch.distributed as dist
sys.path.insert(0, %(pylib)r)
%(imports)s
from dtrain_ref import GPT, param_groups
torch.set_num_threads(1)
dist.init_process_group(%(backend)r)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = GPT(%(L)d, %(H)d, %(C)d, %(V)d, %(T)d)
%(wrap)s
data = np.frombuffer(open(%(data)r, "rb").read(), dtype=np.uint8).astype(np.int64)

def step(s):
    k = (s * world + rank) * %(B)d * %(T)d
    x = torch.from_numpy(data[k:k + %(B)d * %(T)d].reshape(%(B)d, %(T)d))
    y = torch.from_numpy(data[k + 1:k + 1 + %(B)d * %(T)d].reshape(%(B)d, %(T)d))
    opt.zero_grad(set_to_none=True)
    _, loss = ddp(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()

times = []
for s in range(%(steps)d):
    t0 = time.perf_counter()
    loss = step(s)
    times.append(time.perf_counter() - t0)
tps = [world * %(B)d * %(T)d / t for t in times[%(skip)d:]]
result = {"tokens_per_s": sum(tps) / len(tps), "loss": loss,
          "step_ms": 1e3 * sum(times[%(skip)d:]) / len(times[%(skip)d:])}
%(after)s
if rank == 0:
    print(json.dumps(result))
"""


def torch_train(what, wrap, n, data, steps, skip, port, backend="gloo", imports="", after="",
                key="tokens_per_s"):
    """The PyTorch loop on n ranks of `backend`, each pinned to its own core
    with one thread: the mean tokens/s, or with key=None the whole result
    (after: code run once the timed steps are done, adding to `result`)."""
    script = TORCH_TRAIN % dict(pylib=PYLIB, L=L, H=H, C=C, V=V, T=T, B=B, data=data,
                                steps=steps, skip=skip, wrap=wrap, backend=backend,
                                imports=imports, after=after)
    procs = []
    for r in range(n):
        env = dict(os.environ, OMP_NUM_THREADS="1", RANK=str(r), WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(["taskset", "-c", str(r), TORCH_PYTHON, "-c", script],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env))
    outs = [p.communicate() for p in procs]
    if any(p.returncode for p in procs):
        sys.exit("%s failed:\n" % what + "\n".join(o[1][-2000:] for o in outs))
    result = json.loads(outs[0][0].strip().splitlines()[-1])
    return result[key] if key else result
