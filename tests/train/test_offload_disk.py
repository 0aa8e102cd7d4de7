"""NVMe offload against the disk under --nvme-path (issues 4 and 5), end to
end, as root: a 64 MiB tmpfs mounted in a private mount namespace (a mount
that is refused fails the test, it is never skipped), and a directory on
the disk of the test's temporary files:

  test_offload_disk.py DTRAIN

A small disk: with the state on it, the start-up probe writes half of
what is free (before, it wrote 256 MiB whatever the disk held, and the run
died with ENOSPC); with under 32 MiB free after the state it measures
nothing and says so; a disk too small for the state is refused at start,
naming the path, the bytes needed and free, and what would work, and so
is a job of 2 ranks whose states fit it one at a time only.
Nothing is left behind: 2 offloaded ranks, rank 1 killed with SIGKILL
after a checkpoint, then the launcher killed with SIGKILL: the directory
is empty after each, and the checkpoint resumes. A restart with the PID
of a killed run (dtrain as PID 1 of a new PID namespace, as in a
container) beside the files an earlier version left under that PID
(dtrain-optim-1-rank0.bin, dtrain-probe-1.bin) trains, and leaves them as
they were.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import write_words  # noqa: E402

MODEL = ["--n-layer", "2", "--n-head", "4", "--n-embd", "48", "--block-size", "16"]


def args_for(tmp, fs, extra):
    return ["train", "--data", os.path.join(tmp, "data.txt")] + MODEL + [
        "--batch-size", "2", "--threads", "1", "--eval-batches", "0", "--print-every", "1",
        "--offload-optimizer", "nvme", "--nvme-path", fs] + extra


def run(cmd, timeout=120):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def last(msg):
    return msg.strip().splitlines()[-1:]


def leave_free(fs, nbytes):
    """Fills the tmpfs until about nbytes are free."""
    filler = os.path.join(fs, "filler")
    if os.path.exists(filler):
        os.unlink(filler)
    v = os.statvfs(fs)
    size = v.f_bavail * v.f_frsize - nbytes
    with open(filler, "wb") as f:
        f.write(b"\0" * max(size, 0))
    v = os.statvfs(fs)
    return v.f_bavail * v.f_frsize


def small_disk(dtrain, tmp, fs):
    rc, out = run([dtrain] + args_for(tmp, fs, ["--steps", "2"]))
    m = re.search(r"disk under %s: sequential write \d+ MB/s, read \d+ MB/s \((\d+) MiB "
                  r"measured, half of what is free" % re.escape(fs), out)
    check(rc == 0 and m and 16 <= int(m.group(1)) <= 32 and not os.listdir(fs),
          "a 64 MiB disk holding the state: the probe writes half of what is free and the "
          "run trains, leaving nothing (exit %d: %s)" % (rc, m.group(0) if m else last(out)))
    avail = leave_free(fs, 20 << 20)
    rc, out = run([dtrain] + args_for(tmp, fs, ["--steps", "2"]))
    m = re.search(r"disk under %s: not measured: ([0-9.]+) MiB free after the state, and "
                  r"the probe writes half of what is free, at least 16 MiB" % re.escape(fs), out)
    check(rc == 0 and m and float(m.group(1)) < avail / 1048576.0 and
          re.search(r"^step 2/2", out, re.M),
          "%.1f MiB free: the probe is left out, saying why, and the run trains (exit %d: %s)" %
          (avail / 1048576.0, rc, m.group(0) if m else last(out)))
    avail = leave_free(fs, 64 << 10)
    rc, out = run([dtrain] + args_for(tmp, fs, ["--steps", "2"]))
    m = re.search(r"--nvme-path %s: this rank's optimizer state needs (\d+) bytes .* has (\d+) "
                  r"free .*give --nvme-path a directory with room" % re.escape(fs), out)
    check(rc != 0 and m and int(m.group(2)) == avail and int(m.group(1)) > avail and
          os.listdir(fs) == ["filler"],
          "%d bytes free, too few for the state: refused at start naming the path, the bytes "
          "needed and free, and what would work (exit %d: %s)" % (avail, rc, last(out)))
    os.unlink(os.path.join(fs, "filler"))
    # 2 ranks whose states (40 MiB each) fit the 64 MiB one at a time only.
    rc, out = run([dtrain] + args_for(tmp, fs, [
        "--steps", "2", "--nproc", "2", "--zero-stage", "1", "--n-embd", "640",
        "--sub-group-size", "1048576"]))
    m = re.search(r"--nvme-path %s: this rank's optimizer state needs (\d+) bytes .* has (\d+) "
                  r"free .*each rank of the job on that file system needs its own file" %
                  re.escape(fs), out)
    check(rc != 0 and m and 32 << 20 < int(m.group(1)) < 48 << 20 and
          int(m.group(2)) < int(m.group(1)) and not os.listdir(fs),
          "2 ranks whose states fit the disk one at a time only: refused at start naming the "
          "bytes a rank needs and those left free, and nothing is left (exit %d: %s)" %
          (rc, last(out)))


def children(pid):
    """The processes pid started, from whichever of its threads."""
    found = []
    for task in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/children" % (pid, task)) as f:
            found += [int(x) for x in f.read().split()]
    return found


def rank_of(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    return int(env.get(b"RANK", b"-1"))


def empty_soon(fs, seconds=10):
    """A killed process's files go when the kernel closes its descriptors:
    at once, but the launcher's ranks die on its SIGKILL a moment later."""
    t = time.time()
    while os.listdir(fs) and time.time() - t < seconds:
        time.sleep(0.1)
    return os.listdir(fs)


def start_until_checkpoint(dtrain, tmp, fs, out):
    p = subprocess.Popen([dtrain] + args_for(tmp, fs, [
        "--nproc", "2", "--zero-stage", "1", "--steps", "100000", "--out", out,
        "--save-every", "2"]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        if line.startswith("checkpoint "):
            return p, True
    return p, False


def killed(dtrain, tmp, fs):
    out = os.path.join(tmp, "ck")
    p, saved = start_until_checkpoint(dtrain, tmp, fs, out)
    ranks = {rank_of(c): c for c in children(p.pid)} if saved else {}
    if 1 in ranks:
        os.kill(ranks[1], signal.SIGKILL)
    rest = p.stdout.read()
    rc = p.wait(timeout=60)
    left = empty_soon(fs)
    check(saved and 1 in ranks and rc != 0 and not left,
          "2 offloaded ranks, rank 1 killed with SIGKILL after a checkpoint: the job stops "
          "(exit %d: %s) and %s is empty (%s)" % (rc, last(rest), fs, left))
    p, saved = start_until_checkpoint(dtrain, tmp, fs, os.path.join(tmp, "ck2"))
    ranks = children(p.pid) if saved else []
    p.kill()
    p.wait(timeout=60)
    p.stdout.close()
    left = empty_soon(fs)
    check(saved and len(ranks) == 2 and not left,
          "the launcher of 2 offloaded ranks (%s) killed with SIGKILL after a checkpoint (its "
          "ranks die with it): %s is empty (%s)" % (ranks, fs, left))
    rc, msg = run([dtrain] + args_for(tmp, fs, ["--nproc", "2", "--zero-stage", "1",
                                                "--resume", out, "--steps", "6"]))
    check(rc == 0 and "resumed from" in msg and not os.listdir(fs),
          "the last checkpoint resumes, offloaded, and leaves nothing (exit %d: %s)" %
          (rc, last(msg)))


def same_pid(dtrain, tmp, fs):
    old = {"dtrain-optim-1-rank0.bin": b"state of a killed run", "dtrain-probe-1.bin": b"probe"}
    for name, data in old.items():
        with open(os.path.join(fs, name), "wb") as f:
            f.write(data)
    rc, out = run(["unshare", "--pid", "--fork", "--kill-child", dtrain] +
                  args_for(tmp, fs, ["--steps", "2"]))
    kept = {}
    for name in os.listdir(fs):
        with open(os.path.join(fs, name), "rb") as f:
            kept[name] = f.read()
    check(rc == 0 and re.search(r"^step 2/2", out, re.M) and kept == old,
          "dtrain as PID 1 beside the files an earlier version's PID 1 left: it trains and "
          "leaves them as they were (exit %d: %s; %s holds %s)" %
          (rc, last(out), fs, sorted(kept)))
    check("PID 1" in subprocess.run(["unshare", "--pid", "--fork", "sh", "-c", "echo PID $$"],
                                    capture_output=True, text=True).stdout,
          "the namespace gives its first process PID 1, the PID of the old files")


def inside(dtrain, tmp):
    fs = os.path.join(tmp, "fs")
    os.makedirs(fs)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", fs],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("FAIL: cannot mount a 64 MiB tmpfs on %s: %s" % (fs, r.stderr.strip()))
    try:
        small_disk(dtrain, tmp, fs)
    finally:
        subprocess.run(["umount", fs])
    # The rest on the test's own disk, which has room for any probe.
    nvme = os.path.join(tmp, "nvme")
    os.makedirs(nvme)
    killed(dtrain, tmp, nvme)
    same_pid(dtrain, tmp, nvme)


def main():
    dtrain = os.path.realpath(sys.argv[1])
    if "--inside" not in sys.argv:
        # A private mount namespace: the tmpfs is gone with it, whatever happens.
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable,
                            os.path.realpath(__file__), dtrain, "--inside"])
        sys.exit(r.returncode)
    tmp = tempfile.mkdtemp(prefix="dtrain_offload_disk_")
    try:
        write_words(os.path.join(tmp, "data.txt"), 17)
        t0 = time.time()
        inside(dtrain, tmp)
        print("took %.0f s" % (time.time() - t0))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
