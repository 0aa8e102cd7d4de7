"""NVMe offload of the optimizer state (--offload-optimizer nvme) end to
end, against the same run with the state in memory.

  test_offload.py DTRAIN [--quick]

(--quick: 2 ranks only, for the sanitizer builds.)

Exactness: ZeRO stages 1, 2 and 3 at 1, 2 and 3 ranks (5 steps, AdamW,
clipping): every logged loss and the final weights the same bits as the
in-memory run's; the files gone after the run. Stage 3 defers each
layer's update into the next forward (the log shows the first stream
ending in the second step); with --offload-overlap 0, and with bf16
deferred, the same bits too. Resume: stage 3 at 2 ranks
saves at step 3 with the state offloaded, and resuming it (offloaded, and
in memory) ends in the uninterrupted run's bits.
Memory: each rank's optimizer memory is the stream's buffers as planned
(x1.00), and the start-up says where the moments live and what the disk
moved. The step line and the JSON log carry the step's I/O.
Offload_param: stage 3 with the parameters' pieces on NVMe too, the same
bits at 1, 2 and 3 ranks (at 2, also streamed in chunks of 1024 floats,
several a piece) and through a resume. A memory cap: 2 ranks of a
57M-parameter model in a cgroup capped below the in-memory run's need
train with both offloaded; in memory the cap kills them.
Faults: --nvme-path missing, not writable, too small for the state
(RLIMIT_FSIZE below its bytes): refused at start naming the path and the
bytes. (The files have no name, so none can be deleted under a running
job; test_offload_disk.py has the small disk and the killed ranks.)
"""
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import expect_refused, same_bits, train_small, write_words  # noqa: E402

STEPS, LR = 5, 3e-3
MODEL = ["--n-layer", "2", "--n-head", "4", "--n-embd", "48", "--block-size", "16"]


def train(dtrain, tmp, name, extra, steps=STEPS):
    return train_small(dtrain, tmp, name, MODEL, ["--batch-size", "2"] + extra, steps, LR)


def exactness(dtrain, tmp, nvme, quick):
    for ranks in ([2] if quick else [1, 2, 3]):
        for stage in (1, 2, 3):
            base = ["--nproc", str(ranks), "--zero-stage", str(stage)]
            mem = train(dtrain, tmp, "mem%d%d" % (ranks, stage), base)
            off = train(dtrain, tmp, "nv%d%d" % (ranks, stage),
                        base + ["--offload-optimizer", "nvme", "--nvme-path", nvme])
            what = "stage %d at %d rank%s" % (stage, ranks, "s" if ranks > 1 else "")
            check(off[0] == mem[0] and same_bits(off[1], mem[1]),
                  "%s: offloaded, the losses and weights are the in-memory run's bits" % what)
            check(not os.listdir(nvme), "%s: the files are gone after the run (%s)" %
                  (what, os.listdir(nvme)))
            if ranks == 2 and stage == 1:
                report(off, nvme)
            if ranks == 2 and stage == 3:
                deferred(dtrain, tmp, nvme, off, mem, base)
            if stage < 3:
                continue
            both = train(dtrain, tmp, "np%d" % ranks, base + [
                "--offload-optimizer", "nvme", "--offload-param", "nvme", "--nvme-path", nvme])
            check(both[0] == mem[0] and same_bits(both[1], mem[1]),
                  "%s with the parameters offloaded too: the in-memory run's bits" % what)
            check(not os.listdir(nvme), "%s, parameters offloaded: the files are gone" % what)
            if ranks == 2:
                report_params(both)
                # Chunks of 1024 floats: every piece streams in several.
                small = train(dtrain, tmp, "nc%d" % ranks, base + [
                    "--offload-optimizer", "nvme", "--offload-param", "nvme", "--nvme-path",
                    nvme, "--sub-group-size", "1024"])
                check(small[0] == mem[0] and same_bits(small[1], mem[1]),
                      "%s, both offloaded in chunks of 1024 (several a piece): the in-memory "
                      "run's bits" % what)


def deferred(dtrain, tmp, nvme, off, mem, base):
    """Stage 3 defers each layer's update into the next forward: the first
    step's stream ends in the second (the log's I/O bytes 0, then the
    stream's), the start-up says so; with --offload-overlap 0 the update
    runs after backward (every step's bytes its own), and both modes, and
    bf16 deferred, are the in-memory runs' bits."""
    io = [e["io_bytes"] for e in off[4]]
    check("streams each layer's pieces just before its next gather" in off[2] and
          len(io) == STEPS and io[0] == 0 and all(b > 0 for b in io[1:]),
          "stage 3: the update deferred into the next forward (I/O bytes by step %s)" % io)
    alone = train(dtrain, tmp, "alone", base + ["--offload-optimizer", "nvme", "--nvme-path",
                                                 nvme, "--offload-overlap", "0"])
    io = [e["io_bytes"] for e in alone[4]]
    check("streams every piece after backward" in alone[2] and all(b > 0 for b in io) and
          alone[0] == mem[0] and same_bits(alone[1], mem[1]),
          "--offload-overlap 0: the update after backward (I/O bytes by step %s), the "
          "in-memory run's bits" % io)
    m16 = train(dtrain, tmp, "m16", base + ["--dtype", "bf16"])
    o16 = train(dtrain, tmp, "o16", base + ["--dtype", "bf16", "--offload-optimizer", "nvme",
                                            "--nvme-path", nvme])
    check(o16[0] == m16[0] and same_bits(o16[1], m16[1]),
          "stage 3 with --dtype bf16, deferred: the in-memory run's bits")


def report(run, nvme):
    out = run[2]
    check(re.search(r"offload: the optimizer's moments in an unnamed file in %s \(" %
                    re.escape(nvme), out) and
          re.search(r"disk under \S+: sequential write \d+ MB/s, read \d+ MB/s", out),
          "the start-up says where the moments live and what the disk moved")
    check(re.search(r"\| I/O [0-9.]+ ms exposed, [0-9.]+ MB at [0-9]+ MB/s \|", out) and
          all("io_ms" in e and e["io_bytes"] > 0 for e in run[4]),
          "the step line and the log carry each step's I/O")
    peak = out.split("peak memory per rank")[1]
    rows = re.findall(r"^  rank \d+ +\S+ x\S+ +\S+ x\S+ +([0-9.]+) x([0-9.]+)", peak, re.M)
    check(rows and all(abs(float(r[1]) - 1) <= 0.02 for r in rows) and
          "optimizer moments on NVMe" in peak,
          "optimizer memory per rank is the stream's buffers as planned (%s)" % rows)


def report_params(run):
    out = run[2]
    check("the optimizer's moments and the parameters' pieces in" in out and
          re.search(r"\+ [0-9.]+ MB of parameters read \|", out) and
          all(e["io_param_bytes"] > 0 for e in run[4]),
          "offload_param: the start-up says the pieces are in the file, and each step line "
          "and log entry the parameters read")
    peak = out.split("peak memory per rank")[1]
    rows = re.findall(r"^  rank \d+ +\S+ x\S+ +\S+ x\S+ +([0-9.]+) x([0-9.]+)", peak, re.M)
    check(rows and all(abs(float(r[1]) - 1) <= 0.02 for r in rows) and
          "parameter pieces on NVMe" in peak,
          "offload_param: optimizer memory is the stream's three-state buffers as planned (%s)"
          % rows)


def resume(dtrain, tmp, nvme):
    """Saved at step 3 offloaded (the optimizer, then the parameters too),
    resumed offloaded and in memory: the uninterrupted in-memory run's bits."""
    args = ["--nproc", "2", "--zero-stage", "3"]
    full = train(dtrain, tmp, "r_full", args)
    out = os.path.join(tmp, "ck")
    ck = os.path.join(out, "ckpt-00000003")
    off = ["--offload-optimizer", "nvme", "--nvme-path", nvme]
    for what, kept in (("the optimizer offloaded", off),
                       ("the parameters offloaded too", off + ["--offload-param", "nvme"])):
        shutil.rmtree(out, ignore_errors=True)
        train(dtrain, tmp, "r_first", args + kept + ["--out", out, "--save-every", "3"], steps=3)
        for how, extra in (("offloaded", kept), ("in memory", [])):
            got = train(dtrain, tmp, "r_again", args + extra + ["--resume", ck])
            check(got[0] == full[0][3:] and same_bits(got[1], full[1]),
                  "stage 3, %s: saved at step 3 and resumed %s, the uninterrupted in-memory "
                  "run's bits" % (what, how))


CAP_MODEL = ["--n-layer", "8", "--n-head", "12", "--n-embd", "768", "--block-size", "32"]


def memory_cgroup(limit):
    """A memory cgroup (v1, or v2 where the controller is enabled) capped
    at `limit` bytes: its directory, or None where none can be made."""
    name = "dtrain_test_%d" % os.getpid()
    tries = [("/sys/fs/cgroup/memory", ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]),
             ("/sys/fs/cgroup", ["memory.max", "memory.swap.max"])]
    for root, files in tries:
        d = os.path.join(root, name)
        try:
            os.mkdir(d)
        except OSError:
            continue
        try:
            with open(os.path.join(d, files[0]), "w") as f:
                f.write(str(limit))
        except OSError:
            os.rmdir(d)
            continue
        try:  # no swapping out of the cap either, where swap is accounted
            with open(os.path.join(d, files[1]), "w") as f:
                f.write(str(limit) if files[1].startswith("memory.memsw") else "0")
        except OSError:
            pass
        return d
    return None


def run_in(cgroup, args):
    def enter():
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    return subprocess.run(args, capture_output=True, text=True, timeout=300,
                          preexec_fn=enter if cgroup else None)


def peak_rss(out):
    """Each rank's peak RSS less the peers' communication memory it maps
    (the table says how much: the RSS counts those shared pages in both
    processes, a memory cgroup once)."""
    peak = out.split("peak memory per rank")[-1]
    return [float(rss) - float(mapped or 0) for rss, mapped in
            re.findall(r"peak RSS ([0-9.]+)(?:[^\n]*?peers' buffers mapped ([0-9.]+))?", peak)]


def memory_cap(dtrain, tmp, nvme):
    """A model whose stage-3 state does not fit under a memory cap trains
    under it with the optimizer and the parameters on NVMe: 2 ranks in one
    cgroup capped between the offloaded run's need and the in-memory run's,
    which the cap kills. Without a cgroup to make, the measured peaks."""
    args = [dtrain, "train", "--data", os.path.join(tmp, "data.txt")] + CAP_MODEL + [
        "--nproc", "2", "--zero-stage", "3", "--batch-size", "1", "--steps", "3", "--lr",
        "3e-4", "--threads", "1", "--eval-batches", "1", "--print-every", "1"]
    off = ["--offload-optimizer", "nvme", "--offload-param", "nvme", "--nvme-path", nvme,
           "--sub-group-size", "262144"]
    # Stage 3 at 2 ranks holds 16 Psi / 2 = 453 MB a rank in memory, and
    # with both offloaded the 4 Psi / 2 gradients, windows and buffers.
    cap = 2 * 430 << 20
    cg = memory_cgroup(cap)
    try:
        r = run_in(cg, args + off)
        losses = [float(x) for x in re.findall(r"^step \d+/3 \| loss ([0-9.]+)", r.stdout, re.M)]
        rss = peak_rss(r.stdout)
        check(r.returncode == 0 and len(losses) == 3 and len(rss) == 2,
              "both offloaded, 2 ranks of a 57M-parameter model train %s (exit %d, rss %s: %s)" %
              ("under a %d MiB cgroup cap" % (cap >> 20) if cg else "(no memory cgroup here)",
               r.returncode, rss, (r.stdout + r.stderr).strip().splitlines()[-1:]))
        m = run_in(cg, args)
        if cg:
            check(m.returncode != 0,
                  "in memory, the same run does not fit under the cap (exit %d)" % m.returncode)
            m = run_in(None, args)
        mem_rss = peak_rss(m.stdout)
        check(m.returncode == 0 and len(mem_rss) == 2 and rss and
              max(rss) < 0.7 * min(mem_rss) and sum(rss) < cap / 1048576.0 < sum(mem_rss),
              "each offloaded rank's peak RSS (%s MiB) under 0.7 of the in-memory run's (%s); "
              "the cap between their sums" % (rss, mem_rss))
    finally:
        if cg:
            os.rmdir(cg)


def fsize_limit(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def faults(dtrain, tmp, nvme):
    base = ["train", "--data", os.path.join(tmp, "data.txt")] + MODEL + [
        "--steps", "2", "--offload-optimizer", "nvme"]
    missing = os.path.join(tmp, "no_such_dir")
    expect_refused(dtrain, base, [(["--nvme-path", missing], missing + ": no such directory")])
    # Not writable: a read-only directory, or for root (whom modes do not
    # stop) /proc, where no file can be created.
    ro = "/proc"
    if os.geteuid() != 0:
        ro = os.path.join(tmp, "ro")
        os.makedirs(ro, exist_ok=True)
        os.chmod(ro, 0o555)
    expect_refused(dtrain, base, [(["--nvme-path", ro], "--nvme-path %s: cannot create" % ro)])
    r = subprocess.run([dtrain] + base + ["--nvme-path", nvme], capture_output=True, text=True,
                       timeout=120, preexec_fn=fsize_limit(4096))
    msg = r.stdout + r.stderr
    check(r.returncode != 0 and "cannot size" in msg and re.search(r"to the \d+ bytes", msg),
          "a disk too small for the state (file size limit 4096): refused at start naming "
          "the bytes (exit %d: %s)" % (r.returncode, msg.strip().splitlines()[-1:]))


def main():
    dtrain, quick = sys.argv[1], "--quick" in sys.argv
    tmp = tempfile.mkdtemp(prefix="dtrain_offload_")
    nvme = os.path.join(tmp, "nvme")
    os.makedirs(nvme)
    try:
        write_words(os.path.join(tmp, "data.txt"), 17)
        t0 = time.time()
        exactness(dtrain, tmp, nvme, quick)
        if not quick:
            resume(dtrain, tmp, nvme)
            memory_cap(dtrain, tmp, nvme)
            faults(dtrain, tmp, nvme)
        print("took %.0f s" % (time.time() - t0))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
