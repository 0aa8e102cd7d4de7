"""Shrinking (`--min-nproc`): a 4-rank job that loses a rank for good
finishes on 3 with the undisturbed 4-rank run's weights, bit for bit.

  test_shrink.py DTRAIN

Each run is `dtrain train --nproc 4 --max-restarts 3 --min-nproc 3` on a
small GPT whose sizes do not divide by 3 or 4 (C = 34: ZeRO's pieces are
padded), the built-in corpus, with DTRAIN_LAUNCH_TEST_LOST_RANK=K: once a
few steps are logged, rank K is killed with SIGKILL, and its slot cannot be
started again, so the restarted rank K fails before it joins the job and
the job shrinks to 3 ranks, which keep the 4 ranks' blocks of each batch
(rank 0 computes two). Cases, each against the same options at 4 ranks
undisturbed, with reductions that sum in rank order (--comm-algo):
  ddp     --grad-accum 2 (rank 0 sums each block's two micro-batches
          apart), slot 2 lost; then rank 0 of the shrunk job killed too: it
          restarts at 3 ranks and still ends with the same bits
  zero-2  --grad-accum 2 (every micro-batch reduce-scattered), slot 0
          lost: the rank that served the store
  auto    DDP with the default algorithms, which do not sum in rank order:
          the shrunk run says so, and ends within 1e-5 of the 4-rank run
          (30 steps)
The logged losses are the 4-rank run's too (rank order). The auto case
also runs with --trace: the timeline marks the failed start as a failure
too. And refused: bad
values of --min-nproc, and layouts that cannot shrink.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_ref import st_read  # noqa: E402
from dtrain_run import expect_refused, logged, ranks_of, rel_err, run, same_bits  # noqa: E402

STEPS = 80
ONE = ["train", "--model", "tiny", "--n-layer", "2", "--n-head", "2", "--n-embd", "34",
       "--steps", str(STEPS), "--batch-size", "2", "--seq-len", "64", "--eval-batches", "0",
       "--threads", "1", "--print-every", "1000"]
BASE = ONE + ["--nproc", "4"]
EXACT_DDP = ["--comm-algo", "allreduce=naive"]
EXACT_ZERO = ["--comm-algo", "allreduce=naive,reduce_scatter=direct"]


def losses(log):
    return [json.loads(l)["loss"] for l in open(log) if '"loss"' in l]


def wait_for(p, log, ranks, steps):
    """Until the job runs `ranks` ranks and the log holds `steps` more
    steps; their pids, or None when the job ended first."""
    start, deadline = logged(log), time.time() + 60
    while time.time() < deadline and p.poll() is None:
        live = ranks_of(p.pid)
        if len(live) == ranks and logged(log) >= start + steps:
            return live
        time.sleep(0.01)
    return None


def shrink_run(dtrain, tmp, name, args, lost, then_kill_rank0=False):
    """The job with slot `lost` killed and lost for good (and then rank 0
    of the shrunk job killed): (exit code, output, final weights, losses)."""
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".st")
    cmd = [dtrain] + BASE + ["--max-restarts", "3", "--min-nproc", "3", "--log-json", log,
                             "--save-final", final] + args
    env = dict(os.environ, DTRAIN_LAUNCH_TEST_LOST_RANK=str(lost))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env)
    kills = [(4, lost)] + ([(3, 0)] if then_kill_rank0 else [])
    for ranks, rank in kills:
        live = wait_for(p, log, ranks, 3)
        check(live is not None, "%s: the job ran %d ranks before the kill of rank %d"
              % (name, ranks, rank))
        if live:
            os.kill(live[rank], signal.SIGKILL)
    out, _ = p.communicate(timeout=300)
    ok = p.returncode == 0
    return p.returncode, out, st_read(final)[0] if ok else None, losses(log) if ok else None


def reference(dtrain, tmp, name, args):
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".st")
    r = run(dtrain, BASE + ["--log-json", log, "--save-final", final] + args)
    if r.returncode != 0:
        raise SystemExit("reference %s failed:\n%s" % (name, (r.stdout + r.stderr)[-3000:]))
    return st_read(final)[0], losses(log)


def expect_shrunk(name, out, lost, restarts):
    said = ("dtrain launch: the job shrinks from 4 to 3 ranks (of the 4 it started with; "
            "--min-nproc 3): rank %d (slot %d) exited with status 1 before it joined the job "
            "after a restart, so its slot is given up; the global batch is kept: the ranks "
            "left compute the 4 ranks' blocks of each batch, rank 0 computing 2 of them "
            "(DTRAIN_VIRTUAL_WORLD_SIZE=4)" % (lost, lost))
    trainer = (r"shrunk: the 3 of the job's 4 ranks left keep its 4 data-parallel blocks of "
               r"each batch \(\d+ sequences a step, as before\): rank 0 computes blocks 0-1, 2 "
               r"times the others' work, rank r > 0 block r \+ 1")
    check(said in out and len(re.findall(trainer, out)) == restarts - 1 and
          "restart %d of 3: starting the 3 ranks again" % restarts in out and
          "DTRAIN_LAUNCH_TEST_LOST_RANK=%d: rank %d (slot %d) cannot be started again"
          % (lost, lost, lost) in out,
          "%s: the launcher says the job shrank, why, and how the batch is kept; rank 0 of "
          "each shrunk attempt says which blocks each rank computes" % name)
    # The attempt whose rank could not start never completed a step: the
    # summary still counts its restart.
    summary = re.search(r"failures: (\d+) restart\(s\)( \(1 of them failed before their "
                        r"first step\))?,", out)
    check(summary and int(summary.group(1)) == restarts and summary.group(2),
          "%s: the summary counts the %d restarts, the failed start among them (%s)"
          % (name, restarts, summary.group(0) if summary else "no failures line"))


def check_failure_marks(trace, lost):
    """--trace marks both failures: rank `lost` killed (restart 1), and its
    replacement failing before it joined (restart 2), an attempt whose
    rank 0 never opened the marks: the next one marks it from the
    launcher's log of failures."""
    ev = json.load(open(trace)) if os.path.exists(trace) else {"traceEvents": []}
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    fail = sorted((e["args"]["restart"], e["args"]["rank"], e["args"]["how"]) for e in ev
                  if e.get("cat") == "restart" and e.get("name") == "failure")
    check(len(fail) == 2 and fail[0][:2] == (1, lost) and "killed by signal 9" in fail[0][2]
          and fail[1][:2] == (2, lost) and "exited with status 1" in fail[1][2],
          "auto: the timeline marks both failures, the failed start's too (%s)" % fail)


def exact_case(dtrain, tmp, name, args, lost, then_kill_rank0):
    ref, ref_losses = reference(dtrain, tmp, name + "_ref", args)
    rc, out, w, got = shrink_run(dtrain, tmp, name, args, lost, then_kill_rank0)
    restarts = 3 if then_kill_rank0 else 2
    check(rc == 0 and same_bits(w, ref),
          "%s: lost slot %d%s, finished on 3 ranks with the undisturbed 4-rank run's final "
          "weights bit for bit (exit %d)" % (name, lost, ", then rank 0 killed" if
                                             then_kill_rank0 else "", rc))
    check(got == ref_losses, "%s: every logged loss is the 4-rank run's (%d logged, %d)"
          % (name, len(got or []), len(ref_losses)))
    expect_shrunk(name, out, lost, restarts)
    check("sums in rank order, so the weights are the 4-rank run's bits" in out,
          "%s: rank 0 says the weights are the 4-rank run's bits" % name)
    if rc != 0 or not same_bits(w, ref):
        print(out[-6000:])


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        exact_case(dtrain, tmp, "ddp", ["--grad-accum", "2"] + EXACT_DDP, 2, True)
        exact_case(dtrain, tmp, "zero-2", ["--zero-stage", "2", "--grad-accum", "2"] +
                   EXACT_ZERO, 0, False)

        # Rounding differences grow as training goes on (up to 2e-5 after 80
        # steps, by where the kill lands): 30 steps.
        short = ["--steps", "30"]
        ref, _ = reference(dtrain, tmp, "auto_ref", short)
        trace = os.path.join(tmp, "auto.trace.json")
        rc, out, w, _ = shrink_run(dtrain, tmp, "auto", short + ["--trace", trace], 3)
        err, where = rel_err(w, ref, 1e-3, 30) if rc == 0 else (1.0, "")
        check(rc == 0 and err <= 1e-5 and not same_bits(w, ref),
              "auto: the default all-reduce, not in rank order: within 1e-5 of the 4-rank "
              "run's weights, not its bits (worst %.1e, %s; exit %d)" % (err, where, rc))
        check(re.search(r"allreduce=auto does not sum in rank order, so the weights are within "
                        r"rounding of the 4-rank run's \(--comm-algo allreduce=naive gives "
                        r"its bits\)", out), "auto: rank 0 says the weights are within rounding")
        expect_shrunk("auto", out, 3, 2)
        check_failure_marks(trace, 3)

        expect_refused(dtrain, ONE, [
            (["--nproc", "4", "--max-restarts", "1", "--min-nproc", "5"],
             "--min-nproc 5 is out of range for -n 4 (valid: 1 to 4)"),
            (["--nproc", "4", "--max-restarts", "1", "--min-nproc", "-1"],
             "--min-nproc -1 is out of range for -n 4 (valid: 1 to 4)"),
            (["--nproc", "4", "--min-nproc", "3"], "--min-nproc 3 needs --max-restarts K above 0"),
            (["--min-nproc", "3"], "--min-nproc works with --nproc N and --max-restarts K"),
            (["--nproc", "4", "--max-restarts", "1", "--min-nproc", "3", "--tp", "2"],
             "works for pure data parallelism: --strategy ddp with --zero-stage 0, 1 or 2"),
            (["--nproc", "4", "--max-restarts", "1", "--min-nproc", "3", "--zero-stage", "3"],
             "this run has --zero-stage 3"),
            (["--nproc", "4", "--max-restarts", "1", "--min-nproc", "3", "--dtype", "bf16"],
             "this run has gradients reduced in bf16 (--comm-dtype auto, --dtype bf16)"),
        ])
    return finish()


if __name__ == "__main__":
    sys.exit(main())
