"""Restarts on several hosts (issue: lose a rank, lose nothing): each rank's
snapshot is also kept by a partner rank on the next host, and a restart
pools what the hosts hold, so a job that loses a whole host, its ranks and
its shared memory, continues from the last snapshot and ends with the
weights of the run that never failed, bit for bit.

  test_restart_hosts.py DTRAIN

The hosts are made on this machine by tests/train/host_wrap.sh: each rank
gets its host's name (DTRAIN_HOSTNAME) and its host's /dev/shm (a directory
of its own mounted there in a mount namespace), so the ranks of different
hosts talk over TCP and see only their own host's snapshots. Losing a host
is emptying its directory and killing its ranks. One launcher starts every
rank (tests/cli/test_launch_multinode.sh and tests/comm's network-namespace
test cover launchers on separate hosts). Cases, on the tiny preset (24
steps, the loss at step 8), each against the same layout undisturbed:
  ddp, 2 hosts x 1 rank     rank 1 killed, its host's memory kept
  ddp, 2 hosts x 1 rank     host 1 lost: its shard comes from host 0's copy
  zero-3, 2 hosts x 1 rank  host 0 lost (rank 0, the manifest's writer)
  pp 2 x dp 2, 2 hosts x 2  host 1 lost (a whole pipeline stage)
  gpt2, 2 hosts x 1 rank    GPT-2's shapes, 1 layer, ZeRO-3: host 1 lost
                            (4 steps, the loss at step 2)
  ddp, 2 hosts x 1 rank     host 1 lost, then its rank killed again as it
                            fetches the snapshot in the first recovery
                            (DTRAIN_SNAPSHOT_TEST_DIE_FETCHING): the second
                            recovery continues, bit for bit
Each restart must continue from the snapshot in memory, and one that lost a
host say how much was copied between hosts; with rank 0's host the job's
history is lost, and the summary says so rather than staying silent. Needs CAP_SYS_ADMIN for the mount namespaces; says
SKIP and exits 77 without it.
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
from dtrain_ref import st_read  # noqa: E402
from dtrain_run import logged, ranks_of, same_bits  # noqa: E402

WRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_wrap.sh")
BASE = ["train", "--model", "tiny", "--steps", "24", "--batch-size", "4", "--seq-len", "64",
        "--eval-batches", "0", "--threads", "1", "--print-every", "1000"]


def job(dtrain, tmp, name, nproc, per_host, args, lose=None, victims=(), env=None, at=8):
    """Runs nproc ranks, per_host to a host; once `at` steps are logged,
    empties host `lose`'s shared memory (if given) and kills `victims`.
    Returns (exit code, output, final weights or None)."""
    shm = os.path.join(tmp, name + ".shm")
    os.makedirs(shm)
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".st")
    env = dict(os.environ, DTRAIN_TEST_SHM_ROOT=shm, DTRAIN_TEST_PER_HOST=str(per_host),
               **(env or {}))
    cmd = [dtrain, "launch", "-n", str(nproc), "--max-restarts", "2", "--", WRAP, dtrain] + \
        BASE + ["--log-json", log, "--save-final", final] + args
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env)
    if victims:
        deadline = time.time() + 60
        while logged(log) < at and p.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        live = ranks_of(p.pid)
        # Stopped first, so that a victim never meets its emptied memory
        # and ends on its own before the kill (a host lost at once).
        for r in victims:
            if r in live:
                os.kill(live[r], signal.SIGSTOP)
        if lose is not None:
            # Files only: a rank may be writing into the directories meanwhile.
            for root, _, files in os.walk(os.path.join(shm, str(lose))):
                for f in files:
                    try:
                        os.unlink(os.path.join(root, f))
                    except FileNotFoundError:
                        pass
        for r in victims:
            if r in live:
                os.kill(live[r], signal.SIGKILL)
        print("%s: host %s's memory emptied, rank(s) %s killed at logged step %d"
              % (name, lose, list(victims), logged(log)))
    out, _ = p.communicate(timeout=300)
    shutil.rmtree(shm, ignore_errors=True)
    return p.returncode, out, (st_read(final)[0] if p.returncode == 0 else None)


def can_mount():
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs none /dev/shm"], capture_output=True, text=True)
    return r.returncode == 0, r.stderr.strip()


def main():
    dtrain = sys.argv[1]
    ok, why = can_mount()
    if not ok:
        print("SKIP: cannot make a mount namespace with its own /dev/shm: %s" % why)
        sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("ddp", 2, 1, [], [(None, [1], "rank 1 killed, its host's memory kept"),
                                    (1, [1], "host 1 lost")]),
                 ("die", 2, 1, [], [(1, [1], "host 1 lost, then a rank killed while it "
                                     "fetches the snapshot")]),
                 ("zero3", 2, 1, ["--zero-stage", "3"], [(0, [0], "host 0 lost (rank 0)")]),
                 ("pp2dp2", 4, 2, ["--pp", "2", "--dp", "2"], [(1, [2, 3], "host 1 lost")]),
                 # GPT-2's shapes (vocabulary 50257: ZeRO-3's halves of the
                 # state are not equal), one layer: 0.5 GB of state crosses
                 # to the partner each step and back in the recovery. Its
                 # steps cost seconds, so it runs 4 and loses the host at 2.
                 ("gpt2", 2, 1, ["--model", "gpt2", "--n-layer", "1", "--batch-size", "1",
                                 "--seq-len", "64", "--steps", "4", "--zero-stage", "3"],
                  [(1, [1], "host 1 lost")])]
        refs = {}  # one undisturbed run per layout ("die" shares "ddp"'s)
        for name, n, per, args, kills in cases:
            key = (n, per, tuple(args))
            if key not in refs:
                rc, out, refs[key] = job(dtrain, tmp, name + "_ref", n, per, args)
                if rc != 0:
                    print(out[-4000:])
                    raise SystemExit("the undisturbed %s run failed" % name)
            ref = refs[key]
            for i, (lose, victims, what) in enumerate(kills):
                env = {"DTRAIN_SNAPSHOT_TEST_DIE_FETCHING": "1"} if name == "die" else None
                rc, out, w = job(dtrain, tmp, "%s_%d" % (name, i), n, per, args, lose, victims,
                                 env, at=2 if name == "gpt2" else 8)
                same = rc == 0 and w is not None and same_bits(w, ref)
                check(same, "%s on %d hosts, %s: the undisturbed run's final weights bit for "
                      "bit (exit %d)" % (name, n // per, what, rc))
                # The failure during the first recovery ends its attempt:
                # the second recovers.
                first = "restart 2:" if name == "die" else "restart 1:"
                said = [l for l in out.splitlines() if l.startswith(first)]
                if name == "die":
                    check("restart 2 of 2" in out and "killed by signal 9" in out,
                          "die: the failure during the first recovery was restarted from (%s)"
                          % [l for l in out.splitlines() if "dtrain launch:" in l])
                # With two hosts each holds every shard (its own and its
                # partner's copy) unless one is lost.
                told = len(said) == 1 and "from the snapshot in memory" in said[0] and \
                    (lose is None or "copied between hosts" in said[0])
                check(told, "%s, %s: the restart continued from the snapshot in memory%s (%s)"
                      % (name, what, "" if lose is None else
                         " and says what was copied between hosts", said))
                # Rank 0's host lost: the other host kept the job's history
                # and its last step, so the restart counts the steps lost
                # and the summary is whole.
                if lose == 0:
                    summary = re.search(r"failures: 1 restart\(s\), (\d+) step\(s\) lost, "
                                        r"recovery [0-9.]+ s on average .*training efficiency "
                                        r"[0-9.]+%", out)
                    restart_lost = re.search(r", (\d+) step\(s\) lost$", said[0]) if said else None
                    check(summary and restart_lost and
                          summary.group(1) == restart_lost.group(1),
                          "%s, %s: the other host kept the history: the restart and the summary "
                          "count the same steps lost (%s; %s)"
                          % (name, what, said, summary.group(0) if summary else
                             [l for l in out.splitlines() if l.startswith("failures:")]))
                if not (same and told):
                    print(out[-6000:])
    finish()


if __name__ == "__main__":
    main()
