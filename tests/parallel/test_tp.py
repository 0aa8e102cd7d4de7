"""Tensor parallelism (--tp) end to end, against one process on the same
global batch.

  test_tp.py DTRAIN [--quick]

(--quick: tp 2 only, for the sanitizer builds.)

Equivalence (5 steps, AdamW with weight decay, clipping at 1, 2 layers, 4
heads): tp 2, tp 4, tp 2 x dp 2 (DDP over the equal slices), tp 2 x dp 2
with ZeRO-1, and tp 2 and tp 4 with sequence parallelism: every logged loss within 1e-6 relative of one process's, the
final weights (gathered into Hugging Face's names and shapes) within 1e-5
(the worst tensor's ||a - b|| / ||b||). Not bit-identical: a row-parallel
product's output is the sum of the ranks' partial products, added in
another order than one product's, and a block of the gradient norm that
several ranks' slices share adds their parts. The whole tensors
(LayerNorms, wpe, the row-parallel biases) must be the same bits on every
rank of a group (the replica check), and the final validation loss
within 1e-6 of one process's.
Also with bf16 products and mixed precision (tp 2): within 2e-2 of one
process in bf16 (the partial sums round differently).
Traffic: each step's bytes match the reduces tensor parallelism makes per
micro-batch: per layer two all-reduces of B T C floats forward and two
backward, the embeddings' and the head's one each, and the loss's max (N
floats) and sums (2 N doubles), each all-reduce sending 2 (n - 1) / n of
its buffer; sequence parallelism the same (each all-reduce of B T C
becomes a reduce-scatter and an all-gather, (n - 1) / n each), plus the
LayerNorms' weight gradients (2 C floats each), now of each rank's rows.
Memory: each rank's parameters, gradients and optimizer state as planned
(its slices, and the whole tensors), x1.00 of the plan at the start;
--dry-run --tp 2 plans each tp rank's floats as the run does.
Checkpoints: tp 2 writes one shard per slice; resumed at tp 2 bit for
bit; resumed in one process and at tp 4 within 1e-5; a one-process
checkpoint resumed at tp 2 within 1e-5. --init from a weights file gives
one process's run (with SGD) within the tolerances above.
Bad input: heads not divisible, a rank count tp does not divide, --tp
--pp with --pp-partition cost (timed on one rank) and with ZeRO-2 (refused
inside a pipeline), with --strategy ps.
"""
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import (close_to_one, expect_refused, rel_err, run, same_bits,  # noqa: E402
                        train_small, write_words)

STEPS, LR = 5, 3e-3
B, T, C, L = 2, 16, 48, 2


def train(dtrain, tmp, name, extra, steps=STEPS):
    model = ["--n-layer", str(L), "--n-head", "4", "--n-embd", str(C), "--block-size", str(T)]
    return train_small(dtrain, tmp, name, model, extra, steps, LR)


def close(got, ref, what, loss_tol=1e-6, w_tol=1e-5):
    close_to_one(got, ref, what, LR, STEPS, loss_tol, w_tol)


def expected_bytes(n, accum, batch, sp=False):
    """Bytes one rank sends in the reduces of one step (tp.c counts a ring's
    2 (n - 1) / n of each buffer)."""
    N = batch * T
    floats = (4 * L + 2) * N * C + N  # layers' four, embeddings', head's; the loss's max
    if sp:
        floats += (2 * L + 1) * 2 * C  # the LayerNorms' weight gradients
    per_micro = 2.0 * (n - 1) / n * (floats * 4 + 2 * N * 8)
    return per_micro * accum


def equivalence(dtrain, tmp, quick):
    ref = train(dtrain, tmp, "one", ["--batch-size", str(2 * B)])
    layouts = [("tp 2", ["--nproc", "2", "--tp", "2", "--batch-size", str(2 * B)], 2, 2 * B)]
    # With dp 2 the micro-batch is halved: twice the evaluation batches
    # cover the same sequences.
    dp2 = ["--nproc", "4", "--tp", "2", "--batch-size", str(B), "--eval-batches", "4"]
    if not quick:
        layouts += [
            ("tp 4", ["--nproc", "4", "--tp", "4", "--batch-size", str(2 * B)], 4, 2 * B),
            ("tp 2 x dp 2", dp2, 2, B),
            ("tp 2 x dp 2 ZeRO-1", dp2 + ["--zero-stage", "1"], 2, B),
            ("tp 2 sp", ["--nproc", "2", "--tp", "2", "--sequence-parallel", "--batch-size",
                         str(2 * B)], 2, 2 * B),
            ("tp 4 sp", ["--nproc", "4", "--tp", "4", "--sequence-parallel", "--batch-size",
                         str(2 * B)], 4, 2 * B),
        ]
    runs = {}
    for name, args, n, batch in layouts:
        got = runs[name] = train(dtrain, tmp, name.replace(" ", "_"), args)
        close(got, ref, name)
        check("replicas:" in got[2] and "bit-identical" in got[2].split("replicas:")[1][:80],
              "%s: the whole tensors are the same bits on every rank (%s)" %
              (name, got[2].split("replicas:")[-1].splitlines()[0].strip()))
        check("tensor parallel: %d ranks per group" % n in got[2],
              "%s: the batch line describes the groups" % name)
        sent = [e.get("bytes_sent", 0) for e in got[4]]
        want = expected_bytes(n, 1, batch, "sp" in name)
        ddp = "dp 2" in name
        check(all(s >= want * 0.95 and (ddp or s <= want * 1.05) for s in sent),
              "%s: bytes sent per step %s, the reduces' %.0f%s" %
              (name, sent[:2], want, " plus data parallelism's" if ddp else ""))
        start = got[2].split("memory per rank at the start")[1].split("peak memory per rank")[0]
        # Only the table's "MiB x1.0000" cells: the lines after it name the
        # run's temporary files, whose random names can hold "x" and digits.
        ratios = [float(x) for x in re.findall(r"MiB x([0-9.]+)", start)]
        check(ratios and all(abs(r - 1) <= 0.01 for r in ratios),
              "%s: memory at the start as planned for each rank's slices (%s)" % (name, ratios[:5]))
    # --dry-run plans each tp rank's slice: the Psi_q the run planned.
    r = run(dtrain, ["train", "--dry-run", "--data", os.path.join(tmp, "data.txt"), "--n-layer",
                     str(L), "--n-head", "4", "--n-embd", str(C), "--block-size", str(T),
                     "--nproc", "2", "--tp", "2"])
    planned = re.findall(r"tp rank \d: Psi_q = (\d+)", r.stdout)
    ran = re.findall(r"plan, Psi_q = (\d+)", runs["tp 2"][2])
    check(r.returncode == 0 and planned and planned == ran[:len(planned)],
          "--dry-run --tp 2: each tp rank's Psi_q as the run planned it (%s, run %s)"
          % (planned, ran[:2]))
    bf = ["--dtype", "bf16"]
    ref16 = train(dtrain, tmp, "one_bf16", ["--batch-size", str(2 * B)] + bf)
    got16 = train(dtrain, tmp, "tp2_bf16", ["--nproc", "2", "--tp", "2", "--batch-size",
                                            str(2 * B)] + bf)
    close(got16, ref16, "tp 2, bf16 mixed precision", 2e-2, 2e-2)


def checkpoints(dtrain, tmp, quick):
    full = train(dtrain, tmp, "ck_full", ["--nproc", "2", "--tp", "2", "--batch-size",
                                          str(2 * B)], steps=STEPS)
    out = os.path.join(tmp, "ck")
    shutil.rmtree(out, ignore_errors=True)
    train(dtrain, tmp, "ck_first", ["--nproc", "2", "--tp", "2", "--batch-size", str(2 * B),
                                    "--out", out, "--save-every", "3"], steps=3)
    ck = os.path.join(out, "ckpt-00000003")
    shards = sorted(f for f in os.listdir(ck) if f.startswith("shard-"))
    check(len(shards) == 2 and os.path.exists(os.path.join(ck, "manifest.json")),
          "tp 2: one shard per slice and a manifest (%s)" % shards)
    again = train(dtrain, tmp, "ck_tp2", ["--nproc", "2", "--tp", "2", "--batch-size", str(2 * B),
                                          "--resume", ck])
    check(again[0] == full[0][3:] and same_bits(again[1], full[1]),
          "tp 2 -> tp 2: the resumed run's losses and weights are the uninterrupted run's bits")
    one = train(dtrain, tmp, "ck_one", ["--batch-size", str(2 * B), "--resume", ck])
    err, where = rel_err(one[1], full[1], LR, STEPS)
    check(err <= 1e-5, "tp 2 -> one process: weights within 1e-5 (%.2e, %s)" % (err, where))
    if not quick:
        four = train(dtrain, tmp, "ck_tp4", ["--nproc", "4", "--tp", "4", "--batch-size",
                                             str(2 * B), "--resume", ck])
        err, where = rel_err(four[1], full[1], LR, STEPS)
        check(err <= 1e-5, "tp 2 -> tp 4: weights within 1e-5 (%.2e, %s)" % (err, where))
    out1 = os.path.join(tmp, "ck1")
    shutil.rmtree(out1, ignore_errors=True)
    train(dtrain, tmp, "ck1_first", ["--batch-size", str(2 * B), "--out", out1, "--save-every",
                                     "3"], steps=3)
    whole = train(dtrain, tmp, "ck1_tp2", ["--nproc", "2", "--tp", "2", "--batch-size",
                                           str(2 * B), "--resume",
                                           os.path.join(out1, "ckpt-00000003")])
    err, where = rel_err(whole[1], full[1], LR, STEPS)
    check(err <= 1e-5, "one process -> tp 2: weights within 1e-5 (%.2e, %s)" % (err, where))
    # SGD: Adam would move elements whose gradient is rounding noise by lr
    # whatever the noise, which says nothing about how the slices were read.
    init = [os.path.join(tmp, "ck_first.safetensors")]
    sgd = ["--init"] + init + ["--optimizer", "sgd"]
    a = train(dtrain, tmp, "init_one", ["--batch-size", str(2 * B)] + sgd)
    b = train(dtrain, tmp, "init_tp2", ["--nproc", "2", "--tp", "2", "--batch-size", str(2 * B)]
              + sgd)
    close(b, a, "--init at tp 2 (SGD)")


def bad_input(dtrain, tmp):
    base = ["train", "--data", os.path.join(tmp, "data.txt"), "--n-layer", "2", "--n-head", "4",
            "--n-embd", "48", "--block-size", "16", "--steps", "1"]
    expect_refused(dtrain, base, [
        (["--nproc", "3", "--tp", "3"], "heads"),
        (["--nproc", "3", "--tp", "2"], "--tp 2 needs a rank count"),
        (["--nproc", "4", "--tp", "2", "--pp", "2", "--pp-partition", "cost"],
         "a split layer's forward needs its whole group"),
        (["--nproc", "4", "--tp", "2", "--pp", "2", "--zero-stage", "2"],
         "use --zero-stage 1, or 0"),
        (["--nproc", "3", "--tp", "2", "--strategy", "ps"], "cannot split it"),
        (["--nproc", "4", "--tp", "4", "--sequence-parallel", "--batch-size", "1",
          "--block-size", "18"], "the 18 rows of a micro-batch (B x T) do not split over 4"),
        (["--sequence-parallel"], "add --tp 2 or more"),
    ])


def main():
    dtrain, quick = sys.argv[1], "--quick" in sys.argv
    tmp = tempfile.mkdtemp(prefix="dtrain_tp_")
    try:
        write_words(os.path.join(tmp, "data.txt"), 11)
        equivalence(dtrain, tmp, quick)
        checkpoints(dtrain, tmp, quick)
        bad_input(dtrain, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
