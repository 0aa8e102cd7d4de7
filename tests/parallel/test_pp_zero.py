"""ZeRO-1 within a pipeline's stages (--pp 2 --zero-stage 1 over 4 ranks:
2 stages x 2 data-parallel ranks, each stage's optimizer state split over
its 2 ranks) against DDP within the stages and against one process.

  test_pp_zero.py DTRAIN [--quick]

Equivalence (5 steps, M = 4 micro-batches, AdamW with weight decay,
clipping at 1): for 1f1b, zb1p and interleaved (V = 2), ZeRO-1's losses and
final weights equal DDP-within-the-stage's bit for bit (at 2 ranks a
reduce-scatter adds a + b as the all-reduce does, and the norm's block
sums are added in layout order whoever owns them), and one process's
within 1e-6 (losses) and 1e-5 (weights: the tied embedding's two halves add
once per step, see test_pipeline.py). The same bits with bf16 weights and
bf16 gradient accumulation (1f1b). The run's replica check passes.
Memory: every rank's optimizer state, as accounted, within 5% of the
plan's K Psi_q / N (against DDP's K Psi_q: the plan is the formula's, not
the run's); in bf16 all but rank 0, which at the end gathers the other
stage's fp32 master weights to write the final weights file, and counts
them there. In bf16 the final weights file gathers each stage's fp32
masters on its first data-parallel rank only: the other ranks' parameter
peak is DDP's. `--dry-run` prints half of DDP's optimizer state per stage.
Checkpoints: every rank writes its pieces (the tied embedding from stage 0
only); resumed at the same layout bit for bit; at pp 2 with DDP bit for
bit; at 2 ranks of ZeRO-1 without a pipeline, and in one process, within
1e-5; a pp 2 x dp 2 DDP checkpoint resumed with ZeRO-1 bit for bit.
Bad input: ZeRO-2 and -3 with --pp.

--quick, for the sanitizer build: 1f1b and interleaved (zb1p's split
backward runs under it in test_pipeline.py's quick form), bf16, and the
checkpoint resumed at the same layout and in one process: 11 runs of 17.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
sys.path.insert(0, os.path.dirname(__file__))
from checks import check, finish  # noqa: E402
from dtrain_run import expect_refused, rel_err, same_bits, write_words  # noqa: E402
from test_pipeline import LR, STEPS, train  # noqa: E402

PPDP = ["--nproc", "4", "--pp", "2", "--batch-size", "1", "--grad-accum", "4",
        "--eval-batches", "4"]
ONE = ["--batch-size", "2", "--grad-accum", "4"]
KINDS = (("1f1b", []), ("zb1p", []), ("interleaved", ["--pp-virtual", "2"]))


def mem_ratios(out, kind):
    """Each rank's accounted bytes of a kind over its plan's, from the peak
    memory table at the end ("optim 0.1 MiB x1.0000")."""
    peak = out.split("peak memory per rank")[-1]
    return [float(x) for x in re.findall(r"^    plan, .*?%s [0-9.]+ MiB x([0-9.]+)" % kind, peak,
                                         re.M)]



def equivalence(dtrain, tmp, quick):
    ref = train(dtrain, tmp, "one", ONE)
    for kind, extra in KINDS:
        if quick and kind == "zb1p":
            continue
        got = {}
        for z in (0, 1):
            name = "%s_z%d" % (kind, z)
            got[z] = train(dtrain, tmp, name, PPDP + ["--pp-schedule", kind, "--zero-stage",
                                                      str(z)] + extra)
        z1 = got[1]
        check(z1[0] == got[0][0] and same_bits(z1[1], got[0][1]),
              "%s: ZeRO-1 within the stages: losses and weights bit-identical to DDP's" % kind)
        worst = max(abs(a - b) / abs(b) for a, b in zip(z1[0], ref[0]))
        err, where = rel_err(z1[1], ref[1], LR, STEPS)
        check(len(z1[0]) == STEPS and worst <= 1e-6 and err <= 1e-5,
              "%s: ZeRO-1 losses within 1e-6 of one process's (worst %.2e), weights within "
              "1e-5 (worst %.2e, %s)" % (kind, worst, err, where))
        check("ZeRO-1 over" in z1[2] and "replicas: every copy of a part of the model" in z1[2],
              "%s: the batch line names ZeRO-1, and the replicas agree" % kind)
        got = mem_ratios(z1[2], "optim")
        check(len(got) == 4 and all(abs(r - 1) <= 0.05 for r in got)
              and "optim 8 Psi_q / N" in z1[2],
              "%s: every rank's optimizer state within 5%% of 8 Psi_q / N (measured / planned "
              "%s)" % (kind, got))
    bf = ["--dtype", "bf16", "--grad-accum-dtype", "bf16"]
    a = train(dtrain, tmp, "bf16_z0", PPDP + bf)
    b = train(dtrain, tmp, "bf16_z1", PPDP + bf + ["--zero-stage", "1"])
    check(a[0] == b[0] and same_bits(a[1], b[1]),
          "bf16 weights, bf16 accumulation: ZeRO-1 bit-identical to DDP within the stages")
    got = mem_ratios(b[2], "optim")
    check(len(got) == 4 and all(abs(r - 1) <= 0.05 for r in got[1:])
          and "optim 12 Psi_q / N" in b[2],
          "bf16: the optimizer state (fp32 masters and moments) of every rank but the writer "
          "within 5%% of 12 Psi_q / N (%s)" % got)
    # The final weights: each stage's masters gathered on its first rank
    # only (which sends them on), so the others peak as DDP's do.
    pz, pd = mem_ratios(b[2], "params"), mem_ratios(a[2], "params")
    check(len(pz) == 4 and len(pd) == 4 and all(abs(pz[q] / pd[q] - 1) <= 0.05 for q in (1, 3)),
          "bf16: ranks 1 and 3 (dp index 1) gather no master weights for the final file: their "
          "parameter peak is DDP's (%s vs %s)" % (pz, pd))


def dry_run(dtrain, tmp):
    """The per-stage plan without training: ZeRO-1 halves the optimizer
    column at 2 data-parallel ranks and leaves the others."""
    rows = {}
    for z in (0, 1):
        r = subprocess.run([dtrain, "train", "--data", os.path.join(tmp, "data.txt"),
                            "--model", "gpt2", "--dry-run", "--nproc", "4", "--pp", "2",
                            "--zero-stage", str(z)], capture_output=True, text=True, timeout=60)
        rows[z] = [[float(x) for x in l.split()[4:8]] for l in r.stdout.splitlines()
                   if re.match(r"^  [01] +\d+-\d+ ", l)]
    ok = len(rows[0]) == 2 and len(rows[1]) == 2 and all(
        a[0] == b[0] and a[1] == b[1] and abs(b[2] - a[2] / 2) <= 0.1
        for a, b in zip(rows[0], rows[1]))
    check(ok, "--dry-run --pp 2 over 4 ranks: ZeRO-1's optimizer state per stage is DDP's / 2, "
          "params and grads the same (%s vs %s)" % (rows[1], rows[0]))


def checkpoints(dtrain, tmp, quick):
    z1 = PPDP + ["--zero-stage", "1"]

    def leg(name, layout, steps, out, resume):
        args = layout + ["--steps", str(steps), "--out", os.path.join(tmp, out)]
        return train(dtrain, tmp, name, args + (["--resume"] if resume else []), steps)

    straight = train(dtrain, tmp, "ck_straight", z1 + ["--steps", "6"], 6)
    leg("ck_first", z1, 3, "ckZ", False)
    if not quick:
        leg("ck_first_ddp", PPDP, 3, "ckD", False)
    man = json.load(open(os.path.join(tmp, "ckZ", "ckpt-00000003", "manifest.json")))
    owners = [[p[0] for p in sh["pieces"]] for sh in man["shards"]]
    check(len(owners) == 4 and all("wte.weight" in o for o in owners[:2])
          and not any("wte.weight" in o for o in owners[2:])
          and all("h.3.mlp.c_fc.weight" in o for o in owners[2:]),
          "pp 2 x ZeRO-1 checkpoint: a shard per rank, the tied embedding from stage 0's "
          "ranks only")
    cases = [("ck_same", z1, "ckZ", True),
             ("ck_to_ppddp", PPDP, "ck1", True),
             ("ck_from_ppddp", z1, "ckD", True),
             ("ck_to_zero", ["--nproc", "2", "--batch-size", "1", "--grad-accum", "4",
                             "--zero-stage", "1", "--eval-batches", "4"], "ck2", False),
             ("ck_to_one", ONE, "ck3", False)]
    if quick:
        cases = [c for c in cases if c[0] in ("ck_same", "ck_to_one")]
    # Copies of ZeRO-1's checkpoint at step 3, made before ck_same resumes
    # (and so writes on in) the original.
    for out in (c[2] for c in cases if c[2] not in ("ckZ", "ckD")):
        shutil.copytree(os.path.join(tmp, "ckZ"), os.path.join(tmp, out))
    for name, layout, out, exact in cases:
        got = leg(name, layout, 6, out, True)
        if exact:
            check("resumed from" in got[2] and got[0] == straight[0][3:]
                  and same_bits(got[1], straight[1]),
                  "%s: resumed, losses and weights bit-identical to the uninterrupted run" % name)
        else:
            err, where = rel_err(got[1], straight[1], LR, 6)
            check("resumed from" in got[2] and err <= 1e-5,
                  "%s: resumed, weights within 1e-5 of the uninterrupted run (worst %.2e, %s)"
                  % (name, err, where))


def bad_input(dtrain, tmp):
    base = ["train", "--data", os.path.join(tmp, "data.txt"), "--n-layer", "4", "--n-head", "2",
            "--n-embd", "32", "--block-size", "32", "--steps", "1", "--threads", "1",
            "--nproc", "4", "--pp", "2"]
    expect_refused(dtrain, base, [
        (["--zero-stage", "2"], "use --zero-stage 1, or 0"),
        (["--zero-stage", "3"], "use --zero-stage 1, or 0"),
    ])


def main():
    dtrain, quick = sys.argv[1], sys.argv[2:] == ["--quick"]
    with tempfile.TemporaryDirectory() as tmp:
        write_words(os.path.join(tmp, "data.txt"), 7)
        equivalence(dtrain, tmp, quick)
        dry_run(dtrain, tmp)
        checkpoints(dtrain, tmp, quick)
        bad_input(dtrain, tmp)
    finish()


if __name__ == "__main__":
    main()
