"""Restarts from in-memory snapshots (`--max-restarts`): a run whose ranks
are killed ends with the weights of the run that never failed, bit for bit.

  test_restart.py DTRAIN

Each run is `dtrain train --nproc N --max-restarts K` on the tiny preset
(the built-in corpus, 36 steps); a watcher kills ranks with SIGKILL at
random moments once the run has logged a few steps (the moments land in
forward, backward, the all-reduce, the update or the snapshot copy, as
they fall; the seed is printed), then waits for the restarted ranks to
log new steps before the next kill. Cases:
  ddp 3     three kills: a random rank, rank 0 (which serves the store),
            two ranks at once
  zero3 3   one kill
  tp 2      one kill
  pp2 dp2   one kill
each against the same layout undisturbed (at 3 ranks the default ring
all-reduce is not one process's bits, so a layout is its own reference)
  stopped   DDP 2, a rank stopped with SIGSTOP: its peers fail after the
            heartbeat deadline (DTRAIN_HEARTBEAT_TIMEOUT=2), the stopped
            rank is killed with the rest and the job restarts
  in flight ZeRO-3 2, rank 1 killed while a snapshot's background write is
            held back (DTRAIN_SNAPSHOT_TEST_WRITE_MS): the restart continues
            from the snapshot before it, with the same bits
  points    DDP 2, a rank killed (DTRAIN_TEST_KILL_AT) in step 6's forward,
            backward, bucket all-reduce, update, snapshot copy, and in a
            save to --out (--save-every 6): each ends with the same bits,
            and --out holds only whole checkpoints
  every 4   --snapshot-every 4: the restart names the steps lost, and the
            run still ends with the same bits; with --save-every 6 its
            checkpoints are saved from snapshots in the background, and
            one resumed ends with the same bits
  exhausted --max-restarts 1 and two kills: a non-zero exit, and the last
            snapshot in --out (written there when the last restart began)
Each restart prints what failed, where the run continued from and the time
from the failure to the first step after it; the run's last lines count
the failures, the steps lost, the recovery times and the training
efficiency. And refused: --snapshot-every
without restarts.
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_ref import st_read  # noqa: E402
from dtrain_run import expect_refused, logged, ranks_of, run, same_bits  # noqa: E402

STEPS = 36
BASE = ["train", "--model", "tiny", "--steps", str(STEPS), "--batch-size", "4",
        "--seq-len", "64", "--eval-batches", "0", "--threads", "1", "--print-every", "1000"]


def run_with_kills(dtrain, tmp, name, nproc, args, kills, rng, sig=signal.SIGKILL,
                   env=None, restarts=3, after=2):
    """Runs the job, killing per `kills` (each a list of ranks, None for a
    random one) once `after` more steps are logged; returns (exit code,
    output, final weights or None)."""
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".st")
    cmd = [dtrain] + BASE + ["--nproc", str(nproc), "--max-restarts", str(restarts),
                             "--log-json", log, "--save-final", final] + args
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)
    killed = set()
    for targets in kills:
        start = logged(log)
        deadline = time.time() + 60
        while time.time() < deadline and p.poll() is None:  # the attempt is training
            live = ranks_of(p.pid)
            if len(live) == nproc and not killed & set(live.values()) and \
                    logged(log) >= start + after:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.2))
        live = ranks_of(p.pid)
        if not live:  # the job ended first: the checks say what is missing
            print("%s: the job ended before the kill of %s" % (name, targets))
            break
        chosen = [rng.choice(sorted(live)) if r is None else r for r in targets]
        for r in chosen:
            if r in live:
                os.kill(live[r], sig)
                killed.add(live[r])
        print("%s: %s rank(s) %s at logged step %d" % (name, sig.name, chosen, logged(log)))
    out, _ = p.communicate(timeout=300)
    return p.returncode, out, (st_read(final)[0] if p.returncode == 0 else None)


def reference(dtrain, tmp, name, args, nproc=0):
    final = os.path.join(tmp, name + ".st")
    a = BASE + ["--save-final", final] + args + (["--nproc", str(nproc)] if nproc else [])
    r = run(dtrain, a)
    if r.returncode != 0:
        raise SystemExit("reference %s failed:\n%s" % (name, (r.stdout + r.stderr)[-3000:]))
    return st_read(final)[0]


SNAPSHOT_DIRS = set()


def expect_recovered(name, rc, out, w, ref, restarts):
    lines = [l for l in out.splitlines() if l.startswith("restart ")]
    SNAPSHOT_DIRS.update(re.findall(r"\((/dev/shm/dtrain-snap-[0-9a-f]+)\)", out))
    same = rc == 0 and w is not None and same_bits(w, ref)
    check(same, "%s: %d restart(s), the undisturbed run's final weights bit for bit (exit %d)"
          % (name, restarts, rc))
    said = len(lines) == restarts and all("continuing at step" in l for l in lines) \
        and out.count("recovered: ") == restarts \
        and re.search(r"failures: %d restart\(s\), \d+ step\(s\) lost, recovery [\d.]+ s on "
                      r"average .*training efficiency [\d.]+%%" % restarts, out)
    check(said, "%s: each restart says what failed, where the run continued, and the time to the "
          "next step (%s)" % (name, lines))
    if not (same and said):
        print(out[-6000:])


def main():
    dtrain = sys.argv[1]
    seed = int(os.environ.get("TEST_SEED", time.time()))
    rng = random.Random(seed)
    print("seed", seed, "(TEST_SEED repeats it)")
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("ddp 3", "ddp3", 3, [], [[None], [0], [1, 2]]),
                 ("zero-3 at 3 ranks", "z3", 3, ["--zero-stage", "3"], [[None]]),
                 ("tp 2", "tp2", 2, ["--tp", "2"], [[None]]),
                 ("pp 2 x dp 2", "pp2dp2", 4, ["--pp", "2", "--dp", "2"], [[None]])]
        for what, name, n, args, kills in cases:
            ref = reference(dtrain, tmp, name + "_ref", args, n)
            rc, out, w = run_with_kills(dtrain, tmp, name, n, args, kills, rng)
            expect_recovered(what, rc, out, w, ref, len(kills))

        two = reference(dtrain, tmp, "two", [], 2)
        rc, out, w = run_with_kills(dtrain, tmp, "stopped", 2, [], [[1]], rng, signal.SIGSTOP,
                                    {"DTRAIN_HEARTBEAT_TIMEOUT": "2"})
        expect_recovered("a rank stopped (SIGSTOP)", rc, out, w, two, 1)
        check("unresponsive" in out and "restart 1: rank 1 was stopped by signal" in out,
              "stopped: its peers name the rank unresponsive, and the restart blames it, not the "
              "peer that failed first")

        # Deterministic moments (DTRAIN_TEST_KILL_AT, core/fault.h): a rank
        # kills itself in step 6's forward, backward, a bucket's all-reduce
        # and update, in the copy of the snapshot taken after step 5 (which
        # runs during step 6) and in the save of step 6's checkpoint.
        for point, step, rank in (("forward", 6, 1), ("backward", 6, 0), ("allreduce", 6, 1),
                                  ("update", 6, 0), ("snapshot", 5, 1), ("save", 6, 0)):
            out_dir = os.path.join(tmp, "fault-" + point)
            rc, out, w = run_with_kills(
                dtrain, tmp, "fault-" + point, 2, ["--out", out_dir, "--save-every", "6"], [],
                rng, env={"DTRAIN_TEST_KILL_AT": "%s:%d:%d" % (point, step, rank)})
            expect_recovered("rank %d killed in step %d's %s" % (rank, step, point), rc, out, w,
                             two, 1)
            said = [l for l in out.splitlines() if l.startswith("restart 1:")]
            cks = [d for d in os.listdir(out_dir) if d.startswith("ckpt-")]
            check(said and "rank %d killed by signal 9" % rank in said[0] and cks and
                  all(os.path.exists(os.path.join(out_dir, d, "manifest.json")) for d in cks),
                  "%s: the restart names rank %d, and every checkpoint in --out is whole (%s)"
                  % (point, rank, sorted(cks)))

        # Each background copy of the first attempt held back 1 s: after 4
        # steps (each update waits for the copy before it) the kill lands
        # while one is in flight (one rank's mark written or not), and the
        # restart continues from the snapshot before it, in the other slot.
        z3 = ["--zero-stage", "3"]
        z3ref = reference(dtrain, tmp, "z3two_ref", z3, 2)
        rc, out, w = run_with_kills(dtrain, tmp, "inflight", 2, z3, [[1]], rng,
                                    env={"DTRAIN_SNAPSHOT_TEST_WRITE_MS": "1000"}, after=4)
        expect_recovered("killed during a snapshot's background write", rc, out, w, z3ref, 1)
        lost = re.search(r"continuing at step \d+ from the snapshot.*, (\d+) step\(s\) lost", out)
        check(lost and int(lost.group(1)) >= 1 and
              re.search(r"snapshots: \d+ in memory .* on the training thread .*copied in the "
                        r"background in \d+ ms each", out),
              "in flight: the restart continues from the snapshot before the one being copied "
              "(%s), and the snapshots are copied in the background" % (lost and lost.group(0)))

        ck4 = os.path.join(tmp, "ck4")
        rc, out, w = run_with_kills(dtrain, tmp, "every4", 2,
                                    ["--snapshot-every", "4", "--out", ck4, "--save-every", "6"],
                                    [[None]], rng)
        expect_recovered("--snapshot-every 4", rc, out, w, two, 1)
        lost = [l for l in out.splitlines() if l.startswith("restart ")]
        check(lost and re.search(r"step \d+ from the (snapshot|start).*step\(s\) lost", lost[0]),
              "--snapshot-every 4: the steps lost are named (%s)" % lost)
        # --save-every 6 saves from snapshots (one taken at 6, 18, 30 for it)
        # in the background; such a checkpoint resumed without restarts ends
        # with the undisturbed run's bits.
        bg = re.findall(r"checkpoint (\S+) \(saved from the snapshot in the background", out)
        c30 = os.path.join(ck4, "ckpt-00000030")
        check(any(p.endswith("ckpt-00000030") for p in bg) and
              os.path.exists(os.path.join(c30, "manifest.json")),
              "--save-every with snapshots: checkpoints saved from them in the background (%s)"
              % bg)
        r = run(dtrain, BASE + ["--nproc", "2", "--resume", c30, "--save-final",
                                os.path.join(tmp, "from30.st")])
        check(r.returncode == 0 and same_bits(st_read(os.path.join(tmp, "from30.st"))[0], two),
              "resumed from the checkpoint saved in the background at step 30: the undisturbed "
              "run's final weights bit for bit (exit %d)" % r.returncode)

        ckdir = os.path.join(tmp, "ck")
        # More steps than the others: the second kill must land before the end.
        rc, out, w = run_with_kills(dtrain, tmp, "exhausted", 2,
                                    ["--out", ckdir, "--steps", "200"], [[None], [None]], rng,
                                    restarts=1)
        state = os.path.join(ckdir, open(os.path.join(ckdir, "latest")).read().strip(),
                             "state.json") if os.path.exists(os.path.join(ckdir, "latest")) else ""
        check(rc != 0 and "giving up" in out and state and json.load(open(state))["step"] > 0,
              "restarts exhausted: non-zero exit (%d), the launcher gives up, and --out holds "
              "the last snapshot (%s)" % (rc, state))

        expect_refused(dtrain, BASE, [(["--snapshot-every", "3"], "snapshots serve restarts")])
        # A fault point that would never fire is refused, not ignored.
        r = run(dtrain, BASE, env={"DTRAIN_TEST_KILL_AT": "forwrad:3"}, timeout=60)
        check(r.returncode != 0 and "POINT one of forward" in r.stdout + r.stderr,
              "DTRAIN_TEST_KILL_AT=forwrad:3: refused, naming the points (exit %d)" % r.returncode)
        left = [d for d in SNAPSHOT_DIRS if os.path.exists(d)]
        check(SNAPSHOT_DIRS and not left, "the launcher removed every job's snapshot directory "
              "(%d seen, left: %s)" % (len(SNAPSHOT_DIRS), left))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
