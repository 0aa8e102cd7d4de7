"""Context parallelism (--cp, --cp-algo) end to end, against one process on
the same global batch.

  test_cp.py DTRAIN [--quick]

(--quick: cp 2 with each algorithm only, for the sanitizer builds.)

Equivalence (5 steps, AdamW with weight decay, clipping at 1, 2 layers, 4
heads, sequences of 16): cp 2 ring (zig-zag), cp 2 Ulysses, cp 4 ring,
cp 4 Ulysses, cp 2 x dp 2, cp 2 x dp 2 with ZeRO-1, tp 2 x cp 2 with each
algorithm, and tp 2 x cp 2 with sequence parallelism: every logged loss within 1e-6 relative of one process's,
the final weights within 1e-5 (the worst tensor's ||a - b|| / ||b||), the
final validation loss within 1e-6, and every rank's weights the same bits
(the replica check). Not bit-identical: attention over a split sequence
merges partial softmaxes (ring) or runs on other rows (Ulysses), and each
rank's gradient holds its rows' share, summed over the group after.
Memory: with the sequence length fixed, each rank's activations under
ring attention are 1/N of one process's (within 2%), as planned (x1.00 of
the plan for every rank); Ulysses keeps more (its head-sharded copies).
Checkpoints: cp 2 resumed at cp 2 bit for bit, in one process within 1e-5.
Bad input: a sequence length that zig-zag cannot cut, Ulysses with heads
that do not split, a rank count cp does not divide, a --dp that does not
make the rank count, --cp with --strategy ps; --cp-algo without --cp.
"""
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import (close_to_one, expect_refused, rel_err, same_bits,  # noqa: E402
                        train_small, write_words)

STEPS, LR = 5, 3e-3
B, T, C, L = 2, 16, 48, 2


def train(dtrain, tmp, name, extra, steps=STEPS, T=T):
    model = ["--n-layer", str(L), "--n-head", "4", "--n-embd", str(C), "--block-size", str(T)]
    return train_small(dtrain, tmp, name, model, extra, steps, LR)


def close(got, ref, what, loss_tol=1e-6, w_tol=1e-5):
    close_to_one(got, ref, what, LR, STEPS, loss_tol, w_tol)


def equivalence(dtrain, tmp, quick):
    ref = train(dtrain, tmp, "one", ["--batch-size", str(2 * B)])
    whole = ["--batch-size", str(2 * B)]
    # With dp 2 the micro-batch is halved: twice the evaluation batches
    # cover the same sequences.
    dp2 = ["--batch-size", str(B), "--eval-batches", "4"]
    layouts = [("cp 2 ring", ["--nproc", "2", "--cp", "2"] + whole),
               ("cp 2 ulysses", ["--nproc", "2", "--cp", "2", "--cp-algo", "ulysses"] + whole)]
    if not quick:
        layouts += [
            ("cp 4 ring", ["--nproc", "4", "--cp", "4"] + whole),
            ("cp 4 ulysses", ["--nproc", "4", "--cp", "4", "--cp-algo", "ulysses"] + whole),
            ("cp 2 x dp 2", ["--nproc", "4", "--cp", "2"] + dp2),
            ("cp 2 x dp 2 ZeRO-1", ["--nproc", "4", "--cp", "2", "--zero-stage", "1"] + dp2),
            ("tp 2 x cp 2 ring", ["--nproc", "4", "--tp", "2", "--cp", "2"] + whole),
            ("tp 2 x cp 2 ulysses", ["--nproc", "4", "--tp", "2", "--cp", "2", "--cp-algo",
                                     "ulysses"] + whole),
            ("tp 2 x cp 2 ring, sequence parallel", ["--nproc", "4", "--tp", "2", "--cp", "2",
                                                     "--sequence-parallel"] + whole),
        ]
    for name, args in layouts:
        got = train(dtrain, tmp, name.replace(" ", "_"), args)
        close(got, ref, name)
        rep = got[2].split("replicas:")[-1].splitlines()[0]
        check("bit-identical" in rep, "%s: every rank's weights the same bits (%s)" %
              (name, rep.strip()))
        check("context parallel: %s ranks per group" % name.split("cp ")[1][0] in got[2],
              "%s: the batch line describes the groups" % name)


def acts_mib(out, section):
    """Rank 0's measured activation MiB and its x ratio to the plan."""
    part = out.split(section)[1]
    return float(re.search(r"acts ([0-9.]+) MiB", part).group(1)), \
        [float(x) for x in re.findall(r"acts [0-9.]+ MiB x([0-9.]+)", part)]


def memory(dtrain, tmp):
    """Per-rank activations under ring attention fall as 1/N at a fixed T."""
    Tm, args = 512, ["--batch-size", "8"]
    one = train(dtrain, tmp, "mem_one", args, steps=1, T=Tm)[2]
    base = float(re.search(r"MiB +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +([0-9.]+)",
                           one).group(1))
    for n in (2, 4):
        out = train(dtrain, tmp, "mem_cp%d" % n, args + ["--nproc", str(n), "--cp", str(n)],
                    steps=1, T=Tm)[2]
        got, ratios = acts_mib(out, "peak memory per rank")
        check(abs(got * n / base - 1) <= 0.02 and ratios and all(abs(r - 1) <= 0.01
                                                                  for r in ratios),
              "cp %d ring: activations per rank %.1f MiB, 1/%d of one process's %.1f MiB "
              "(plan ratios %s)" % (n, got, n, base, ratios))
    out = train(dtrain, tmp, "mem_uly", args + ["--nproc", "2", "--cp", "2", "--cp-algo",
                                                "ulysses"], steps=1, T=Tm)[2]
    got, ratios = acts_mib(out, "peak memory per rank")
    check(got > base / 2 and all(abs(r - 1) <= 0.01 for r in ratios),
          "cp 2 ulysses: activations per rank %.1f MiB, above ring's half of %.1f MiB, as "
          "planned (%s)" % (got, base, ratios))


def checkpoints(dtrain, tmp):
    args = ["--nproc", "2", "--cp", "2", "--batch-size", str(2 * B)]
    full = train(dtrain, tmp, "ck_full", args)
    out = os.path.join(tmp, "ck")
    shutil.rmtree(out, ignore_errors=True)
    train(dtrain, tmp, "ck_first", args + ["--out", out, "--save-every", "3"], steps=3)
    ck = os.path.join(out, "ckpt-00000003")
    again = train(dtrain, tmp, "ck_cp2", args + ["--resume", ck])
    check(again[0] == full[0][3:] and same_bits(again[1], full[1]),
          "cp 2 -> cp 2: the resumed run's losses and weights are the uninterrupted run's bits")
    one = train(dtrain, tmp, "ck_one", ["--batch-size", str(2 * B), "--resume", ck])
    err, where = rel_err(one[1], full[1], LR, STEPS)
    check(err <= 1e-5, "cp 2 -> one process: weights within 1e-5 (%.2e, %s)" % (err, where))


def bad_input(dtrain, tmp):
    base = ["train", "--data", os.path.join(tmp, "data.txt"), "--n-layer", "2", "--n-head", "4",
            "--n-embd", "48", "--steps", "1"]
    expect_refused(dtrain, base, [
        (["--block-size", "18", "--nproc", "2", "--cp", "2"],
         "T = 18 is not a multiple of 2N = 4 (zig-zag"),
        (["--block-size", "18", "--nproc", "2", "--cp", "2"], "T = 16 or 20 would work"),
        (["--block-size", "24", "--nproc", "3", "--cp", "3", "--cp-algo", "ulysses"],
         "the 4 heads do not split into 3; --cp 1, 2 or 4 would"),
        (["--block-size", "16", "--nproc", "4", "--tp", "2", "--cp", "4", "--cp-algo",
          "ulysses"], "--tp 2 --cp 4 needs a rank count that 8 divides"),
        (["--block-size", "16", "--nproc", "3", "--cp", "2"], "start --nproc 2 or 4"),
        (["--block-size", "16", "--nproc", "4", "--cp", "2", "--dp", "3"],
         "--dp 3 with --cp 2 makes 6 ranks"),
        (["--block-size", "16", "--nproc", "3", "--cp", "2", "--strategy", "ps"],
         "cannot split them"),
        (["--block-size", "16", "--cp-algo", "ulysses"], "add --cp 2 or more"),
    ])
    # With tp 2 the ranks of a tp group hold 2 heads each: Ulysses over 4
    # context-parallel ranks cannot give each whole heads.
    expect_refused(dtrain, base, [
        (["--block-size", "16", "--nproc", "8", "--tp", "2", "--cp", "4", "--cp-algo",
          "ulysses"], "the 2 heads of a tensor-parallel rank do not split into 4"),
    ])


def main():
    dtrain, quick = sys.argv[1], "--quick" in sys.argv
    tmp = tempfile.mkdtemp(prefix="dtrain_cp_")
    try:
        write_words(os.path.join(tmp, "data.txt"), 13)
        equivalence(dtrain, tmp, quick)
        if not quick:
            memory(dtrain, tmp)
            checkpoints(dtrain, tmp)
        bad_input(dtrain, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
