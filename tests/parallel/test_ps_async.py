"""The parameter server's asynchronous mode: its fixed staleness
(--fixed-staleness), with which each server applies the pushes step by
step, worker by worker, and every worker computes step t (from 0) on the
parameters after t - K steps however the ranks are scheduled; and workers
that stop at different steps.

  test_ps_async.py DTRAIN [--quick]

(--quick: without the signals, for the sanitizer builds: under TSan a
SIGTERM never reaches the trainer's watcher thread. Nor the three runs
that pin the staleness to exactly K: they check arithmetic the plain
build checks, where the sanitizers look at the server's threads, which
the reproducible and resumed runs exercise as much: 32 -> 25 s alone
under TSan.)

Every run has 2 workers and a constant learning rate; the fixed-staleness
runs have 2 servers and K = 2 unless said otherwise.

  - Reproducible: two runs log the same losses, norms and validation losses
    and end with the same bits.
  - Exactly K steps late: rank 0 evaluates its own parameters after every
    step. After s steps they must be those after s - K: the final
    validation loss of a run of s - K steps, and not that of s - K - 1 or
    s - K + 1 steps; and after 1 to K steps, the starting ones.
  - Resumable: with K = 0, a run resumed from its checkpoint after step 5
    ends with the bits of the run that went on (the checkpoint holds the
    parameters after every worker's pushes of its step, whoever got there
    first).
  - The arrival order (without the option) still trains to the end with
    identical ranks, and learns.
  - A worker that stops early (SIGTERM to rank 1, as when a Ctrl-C reaches
    the ranks after different steps) holds the other back no longer: rank 0
    goes on alone, and when it stops too the ranks end identical; with
    --staleness 0 in arrival order and with a fixed staleness (rank 0 once
    waited for rank 1's next push until killed).
  - Bad input: the option under synchronous mode or another strategy, a
    value other than 0 or 1, a staleness that leaves every step on the
    starting parameters.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import expect_refused, same_bits, train_logged, write_words  # noqa: E402

K = 2
STEPS = 20
MID = 10  # the run whose end rank 0's parameters after MID + K steps must equal


def train(dtrain, tmp, name, steps, extra, staleness=K):
    log = os.path.join(tmp, name + ".json")
    final = os.path.join(tmp, name + ".safetensors")
    args = ["train", "--data", os.path.join(tmp, "data.txt"), "--nproc", "4", "--servers", "2",
            "--strategy", "ps", "--ps-mode", "async", "--staleness", str(staleness),
            "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
            "--batch-size", "4", "--lr", "1e-3", "--lr-schedule", "constant",
            "--warmup-steps", "0", "--eval-batches", "4", "--seed", "3", "--threads", "1",
            "--print-every", "100", "--steps", str(steps), "--log-json", log,
            "--save-final", final] + extra
    entries, weights, out = train_logged(dtrain, args, log, final)
    vals = [json.loads(l)["val_loss"] for l in open(log) if '"val_loss"' in l]
    return entries, weights, out, vals


def reproducible(dtrain, tmp):
    """Two runs of the same job with the option, one without."""
    a, b = (train(dtrain, tmp, "fixed%d" % i, STEPS, ["--fixed-staleness", "--eval-every", "1"])
            for i in (1, 2))
    steps_a = [(e["loss"], e["grad_norm"]) for e in a[0]]
    steps_b = [(e["loss"], e["grad_norm"]) for e in b[0]]
    check(len(steps_a) == STEPS and steps_a == steps_b,
          "--fixed-staleness: two runs log the same %d losses and norms" % len(steps_a))
    check(len(a[3]) == STEPS and a[3] == b[3],
          "--fixed-staleness: two runs log the same %d validation losses" % len(a[3]))
    check(same_bits(a[1], b[1]), "--fixed-staleness: two runs end with the same bits")
    check("async with staleness 2 fixed" in a[2], "the batch line names the fixed staleness")
    arrival = train(dtrain, tmp, "arrival", STEPS, ["--eval-every", "1"])
    check("bit-identical" in arrival[2] and len(arrival[0]) == STEPS,
          "arrival order: %d steps, and the ranks end identical" % len(arrival[0]))
    check(arrival[3][-1] < a[3][0] - 0.1,
          "arrival order learns: final validation loss %.4f, %.4f at the start"
          % (arrival[3][-1], a[3][0]))
    return a[3]


def exactly_k_late(dtrain, tmp, vals):
    """vals[s - 1]: rank 0's validation loss after step s of a STEPS run."""
    ends = {}
    for n in (MID - 1, MID, MID + 1):
        ends[n] = train(dtrain, tmp, "end%d" % n, n, ["--fixed-staleness"])[3][-1]
    got = vals[MID + K - 1]
    check(abs(got - ends[MID]) <= 1e-6 * ends[MID],
          "after %d steps rank 0 holds the parameters after %d: validation loss %.8f, "
          "a run of %d steps ends at %.8f" % (MID + K, MID, got, MID, ends[MID]))
    for n in (MID - 1, MID + 1):
        check(abs(got - ends[n]) > 1e-4,
              "... and not those after %d (%.8f)" % (n, ends[n]))
    start = vals[0]
    check(all(v == start for v in vals[:K]) and vals[K] < start - 1e-4,
          "steps 0 to %d run on the starting parameters (validation loss %.6f), step %d on "
          "those after one step (%.6f)" % (K, start, K + 1, vals[K]))


def resumed(dtrain, tmp):
    ck = os.path.join(tmp, "ck")
    fixed0 = ["--fixed-staleness"]
    whole = train(dtrain, tmp, "whole", 10, fixed0 + ["--out", ck, "--save-every", "5"], 0)
    again = train(dtrain, tmp, "resumed", 10,
                  fixed0 + ["--resume", os.path.join(ck, "ckpt-00000005")], 0)
    check(same_bits(whole[1], again[1]),
          "K = 0: resumed after step 5, a run ends with the bits of the one that went on")


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


def bad_input(dtrain, tmp):
    base = ["train", "--data", os.path.join(tmp, "data.txt"), "--steps", "5", "--n-layer", "1",
            "--n-head", "1", "--n-embd", "16", "--block-size", "16"]
    ps = ["--strategy", "ps", "--nproc", "3"]
    expect_refused(dtrain, base, [
        (ps + ["--fixed-staleness"], "--fixed-staleness applies to --ps-mode async"),
        (["--fixed-staleness"], "--fixed-staleness applies to --strategy ps"),
        (ps + ["--ps-mode", "async", "--fixed-staleness=2"], "not a boolean"),
        (ps + ["--ps-mode", "async", "--staleness", "4", "--fixed-staleness"],
         "give a staleness of at most 3"),
    ])


def main():
    dtrain = sys.argv[1]
    quick = "--quick" in sys.argv[2:]
    with tempfile.TemporaryDirectory() as tmp:
        write_words(os.path.join(tmp, "data.txt"), 11)
        vals = reproducible(dtrain, tmp)
        if not quick:
            exactly_k_late(dtrain, tmp, vals)
        resumed(dtrain, tmp)
        if not quick:
            one_stops(dtrain, tmp, "stop-arrival0", ["--staleness", "0"])
            one_stops(dtrain, tmp, "stop-fixed", ["--staleness", "1", "--fixed-staleness"])
        bad_input(dtrain, tmp)
    finish()


if __name__ == "__main__":
    main()
