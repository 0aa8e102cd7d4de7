"""The parameter server's asynchronous mode: workers that stop at
different steps.

  test_ps_async.py DTRAIN

  - A worker that stops early (SIGTERM to rank 1, as when a Ctrl-C reaches
    the ranks after different steps) holds the other back no longer: rank 0
    goes on alone, and when it stops too the ranks end identical; with
    --staleness 0 (rank 0 once waited for rank 1's next push until killed).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import write_words  # noqa: E402


def rank_pid(launcher, rank):
    """The pid of the launcher's child that runs `rank`, or None."""
    try:
        children = open("/proc/%d/task/%d/children" % (launcher, launcher)).read().split()
    except OSError:
        return None
    for child in children:
        try:
            env = open("/proc/%s/environ" % child, "rb").read().split(b"\0")
        except OSError:
            continue
        if b"RANK=%d" % rank in env:
            return int(child)
    return None


def logged_steps(log):
    return open(log).read().count('"loss"') if os.path.exists(log) else 0


def wait_for(cond, seconds):
    end = time.time() + seconds
    while not cond() and time.time() < end:
        time.sleep(0.05)
    return cond()


def one_stops(dtrain, tmp, name, extra):
    """SIGTERM to rank 1, then once rank 0 has gone on alone for a while,
    to rank 0: both stop, and the job ends with identical ranks."""
    log = os.path.join(tmp, name + ".json")
    args = [dtrain, "train", "--data", os.path.join(tmp, "data.txt"), "--nproc", "3",
            "--strategy", "ps", "--ps-mode", "async", "--n-layer", "1", "--n-head", "2",
            "--n-embd", "32", "--block-size", "32", "--batch-size", "4", "--threads", "1",
            "--eval-batches", "2", "--print-every", "100000", "--steps", "100000",
            "--log-json", log] + extra
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids = {}
    started = wait_for(lambda: logged_steps(log) >= 3 and
                       all(pids.setdefault(r, rank_pid(p.pid, r)) for r in (0, 1)), 60)
    alone = False
    if started:
        os.kill(pids[1], signal.SIGTERM)
        at = logged_steps(log)
        alone = wait_for(lambda: logged_steps(log) >= at + 50, 30)
        os.kill(pids[0], signal.SIGTERM)
    try:
        out, _ = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.terminate()  # the launcher stops its ranks
        try:
            out = p.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0]
        out += "\n(stopped: still running 60 s after the signals)"
    said = [l for l in out.splitlines() if "replicas" in l or "error" in l or "still" in l]
    check(started and alone and "bit-identical" in out,
          "%s: after SIGTERM to rank 1, rank 0 went on alone (%s); after SIGTERM to rank 0 "
          "the job ended with identical ranks (%s)" % (" ".join(extra), alone, said[-1:]))


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        write_words(os.path.join(tmp, "data.txt"), 11)
        one_stops(dtrain, tmp, "stop-arrival0", ["--staleness", "0"])
    finish()


if __name__ == "__main__":
    main()
