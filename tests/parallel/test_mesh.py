"""The 4D mesh (--tp x --cp x --dp x --pp, ZeRO inside data parallelism)
end to end, against one process on the same global batch.

  test_mesh.py DTRAIN [--quick]

(--quick: pp 2 x tp 2 at 4 ranks only, for the sanitizer builds.)

Equivalence (5 steps, AdamW with weight decay, clipping at 1, 2 layers, 4
heads, sequences of 16, a global batch of 4 sequences): dp 2 x pp 2 x tp 2,
pp 2 x tp 2 x cp 2, dp 2 x pp 2 with ZeRO-1, dp 4 x tp 2 with ZeRO-3 and
dp 2 x cp 2 x tp 2 with sequence parallelism, at 8 ranks (dp 2 x pp 2 at
4); tp 2 x cp 2 with ZeRO-3 and dp 2 x tp 2 with ZeRO-2; pp 2 x tp 2 with sequence parallelism under zb1p (split backward), and
pp 2 x cp 2 interleaved (V = 2, 4 layers, against its own one process):
every logged loss within 1e-6
relative of one process's, the final weights within 1e-5 (the worst
tensor's ||a - b|| / ||b||), the final validation loss within 1e-6, and the
run's replica check passed. Not bit-identical: tensor parallelism sums
partial products, context parallelism merges partial softmaxes, and the
tied embedding's two halves add once per step.
Memory: every rank of pp 2 x tp 2 x cp 2 within 2% of its plan (its
stage's slices, its rows), and `--dry-run` plans the same floats for each
stage and tp rank.
Banner: on two fake hosts of 4 ranks, the groups of each axis in
Megatron's order (tp fastest) and the hosts; a tensor-parallel group that
spans hosts gets a note.
Checkpoints: dp 2 x pp 2 x tp 2 saved at step 3 (one shard per stage and
slice) and resumed at the same layout bit for bit, and in one process
within 1e-5.
Spellings: Megatron's --tensor-model-parallel-size and
--pipeline-model-parallel-size, DeepSpeed's tensor_parallel.autotp_size
and pipeline.stages, and --dp 1 --tp 2 --pp 2 without --nproc (4 ranks
started) give --tp 2 --pp 2's losses bit for bit.
Bad input: a --dp that does not make the rank count, sizes whose product
does not divide it, tp not dividing the heads, more stages than layers, a
batch that sequence parallelism cannot split; each names what would work.
"""
import json
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
T = 16
ONE = ["--batch-size", "2", "--grad-accum", "2"]  # the global batch: 4 sequences
HALF = ["--batch-size", "1", "--grad-accum", "2", "--eval-batches", "4"]  # dp 2's share


def model(layers=2):
    return ["--n-layer", str(layers), "--n-head", "4", "--n-embd", "48", "--block-size", str(T)]


def train(dtrain, tmp, name, extra, layers=2, steps=STEPS):
    return train_small(dtrain, tmp, name, model(layers), extra, steps, LR)


def replicas_agree(out, what):
    check("replicas:" in out and "bit-identical" in out.split("replicas:")[1].splitlines()[0],
          "%s: the run's replica check passed" % what)


def equivalence(dtrain, tmp, quick):
    ref = train(dtrain, tmp, "one", ONE)
    layouts = [("pp 2 x tp 2", ["--nproc", "4", "--pp", "2", "--tp", "2"] + ONE)]
    if not quick:
        layouts += [
            ("dp 2 x pp 2 x tp 2", ["--nproc", "8", "--pp", "2", "--tp", "2"] + HALF),
            ("pp 2 x tp 2 x cp 2", ["--nproc", "8", "--pp", "2", "--tp", "2", "--cp", "2"] + ONE),
            ("dp 2 x pp 2 ZeRO-1", ["--nproc", "4", "--pp", "2", "--zero-stage", "1"] + HALF),
            ("dp 4 x tp 2 ZeRO-3", ["--nproc", "8", "--tp", "2", "--zero-stage", "3",
                                    "--batch-size", "1", "--eval-batches", "4"]),
            ("dp 2 x cp 2 x tp 2 sp", ["--nproc", "8", "--tp", "2", "--cp", "2",
                                       "--sequence-parallel"] + HALF),
            ("tp 2 x cp 2 ZeRO-3", ["--nproc", "4", "--tp", "2", "--cp", "2", "--zero-stage",
                                    "3"] + ONE),
            ("dp 2 x tp 2 ZeRO-2", ["--nproc", "4", "--tp", "2", "--zero-stage", "2"] + HALF),
        ]
    outs = {}
    for name, args in layouts:
        got = train(dtrain, tmp, name.replace(" ", "_"), args)
        close_to_one(got, ref, name, LR, STEPS)
        replicas_agree(got[2], name)
        outs[name] = got[2]
    if quick:
        return outs
    zb = ["--nproc", "4", "--pp", "2", "--tp", "2", "--sequence-parallel", "--pp-schedule",
          "zb1p"] + ONE
    got = train(dtrain, tmp, "zb1p_sp", zb)
    close_to_one(got, ref, "pp 2 x tp 2 sp zb1p", LR, STEPS)
    ref4 = train(dtrain, tmp, "one_l4", ONE, layers=4)
    inter = ["--nproc", "4", "--pp", "2", "--cp", "2", "--pp-schedule", "interleaved"] + ONE
    got = train(dtrain, tmp, "interleaved_cp", inter, layers=4)
    close_to_one(got, ref4, "pp 2 x cp 2 interleaved", LR, STEPS)
    return outs


def dry_run(dtrain, tmp, out):
    """--dry-run's rows (stage, tp rank) hold what the run's ranks planned."""
    args = ["train", "--data", os.path.join(tmp, "data.txt")] + model() + [
        "--nproc", "8", "--pp", "2", "--tp", "2", "--cp", "2", "--dry-run"] + ONE
    r = run(dtrain, args)
    rows = re.findall(r"stage (\d) \(\d in flight\), tp rank (\d): Psi_q = (\d+)", r.stdout)
    start = out.split("peak memory per rank")[0]
    ran = re.findall(r"plan, Psi_q = (\d+)", start)
    # ranks 0-3 are stage 0 (tp rank r % 2), 4-7 stage 1
    want = [(str(r // 4), str(r % 2), ran[r]) for r in (0, 1, 4, 5)] if len(ran) == 8 else []
    check(r.returncode == 0 and rows == want,
          "--dry-run's Psi_q per stage and tp rank %s equal the run's plans %s" % (rows, want))


def memory(out):
    """Every rank's 'state + acts' against its plan (the table's ratios)."""
    start = out.split("peak memory per rank")[0]
    ratios = [float(x) for x in re.findall(r"state \+ acts [0-9.]+ MiB x([0-9.]+)", start)]
    check(len(ratios) == 8 and all(abs(r - 1) <= 0.02 for r in ratios),
          "pp 2 x tp 2 x cp 2: every rank's model state and activations within 2%% of its "
          "plan (%s)" % ratios)


def banner(dtrain, tmp):
    common = ["train", "--data", os.path.join(tmp, "data.txt")] + model() + [
        "--steps", "1", "--threads", "1", "--eval-batches", "0"]
    r = run(dtrain, common + ["--nproc", "8", "--tp", "2", "--pp", "2", "--batch-size", "1",
                              "--grad-accum", "2"],
            env={"DTRAIN_HOSTNAME": ",".join(["hostA"] * 4 + ["hostB"] * 4)})
    out = r.stdout
    check(r.returncode == 0, "banner run exits 0 (%s)" % r.stderr.strip()[-300:])
    want = ["mesh: tp 2 x cp 1 x dp 2 x pp 2 = 8 ranks",
            "tp groups: [0 1] [2 3] [4 5] [6 7]",
            "dp groups: [0 2] [1 3] [4 6] [5 7]",
            "pp groups: [0 4] [1 5] [2 6] [3 7]",
            "hosts: hostA (ranks 0-3), hostB (ranks 4-7)"]
    for w in want:
        check(w in out, "the banner shows %r" % w)
    check("spans hosts" not in out, "tensor-parallel groups inside a host: no note")
    r = run(dtrain, common + ["--nproc", "4", "--tp", "2"],
            env={"DTRAIN_HOSTNAME": "hostA,hostB,hostA,hostB"})
    check(r.returncode == 0 and "a tensor-parallel group spans hosts" in r.stdout,
          "a tensor-parallel group across hosts is noted")


def checkpoints(dtrain, tmp):
    lay = ["--nproc", "8", "--pp", "2", "--tp", "2"] + HALF
    full = train(dtrain, tmp, "ck_full", lay)
    ck = os.path.join(tmp, "ck")
    train(dtrain, tmp, "ck_first", lay + ["--out", ck], steps=3)
    shards = [f for f in os.listdir(os.path.join(ck, "ckpt-00000003")) if f.startswith("shard")]
    check(len(shards) == 4, "one shard per stage and slice (%d)" % len(shards))
    again = train(dtrain, tmp, "ck_again", lay + ["--resume", os.path.join(ck, "ckpt-00000003")])
    check(again[0] == full[0][3:] and same_bits(again[1], full[1]),
          "resumed at dp 2 x pp 2 x tp 2: the last 2 losses and the weights bit for bit")
    one = train(dtrain, tmp, "ck_one", ONE + ["--resume", os.path.join(ck, "ckpt-00000003")])
    worst = max(abs(a - b) / abs(b) for a, b in zip(one[0], full[0][3:]))
    err, where = rel_err(one[1], full[1], LR, STEPS)
    check(len(one[0]) == 2 and worst <= 1e-6 and err <= 1e-5,
          "resumed in one process: losses within 1e-6 (%.2e), weights within 1e-5 (%.2e, %s)"
          % (worst, err, where))


def spellings(dtrain, tmp):
    base = ["--nproc", "4", "--tp", "2", "--pp", "2"] + ONE
    ref = train(dtrain, tmp, "sp_ref", base)
    mega = train(dtrain, tmp, "sp_megatron", ["--nproc", "4", "--tensor-model-parallel-size",
                                              "2", "--pipeline-model-parallel-size", "2"] + ONE)
    cfg = os.path.join(tmp, "ds.json")
    with open(cfg, "w") as f:
        json.dump({"tensor_parallel": {"autotp_size": 2}, "pipeline": {"stages": 2}}, f)
    ds = train(dtrain, tmp, "sp_deepspeed", ["--nproc", "4", "--config", cfg] + ONE)
    sized = train(dtrain, tmp, "sp_sized", ["--dp", "1", "--tp", "2", "--pp", "2"] + ONE)
    for name, got in (("Megatron's flags", mega), ("DeepSpeed's JSON", ds),
                      ("--dp 1 --tp 2 --pp 2 without --nproc", sized)):
        check(got[0] == ref[0] and same_bits(got[1], ref[1]),
              "%s: --tp 2 --pp 2's losses and weights bit for bit" % name)
    check("= 4 ranks" in sized[2], "--dp 1 --tp 2 --pp 2 started 4 ranks")


def bad_input(dtrain, tmp):
    base = ["train", "--data", os.path.join(tmp, "data.txt")] + model() + [
        "--steps", "1", "--threads", "1"]
    expect_refused(dtrain, base, [
        (["--nproc", "8", "--tp", "2", "--pp", "2", "--dp", "3"],
         "makes 12 ranks (tp x cp x dp x pp); this job has 8: start --nproc 12"),
        (["--nproc", "6", "--tp", "2", "--pp", "2"],
         "needs a rank count that 4 divides"),
        (["--nproc", "6", "--tp", "3", "--pp", "2"], "--tp 1, 2 or 4 would work"),
        (["--nproc", "8", "--tp", "2", "--pp", "4"], "need at least 4 layers"),
        (["--nproc", "8", "--tp", "4", "--pp", "2", "--sequence-parallel", "--batch-size", "1",
          "--block-size", "18"], "do not split over 4"),
        (["--nproc", "4", "--dp", "2"], "--dp 2, but this job has 4 ranks"),
    ])


def main():
    dtrain = sys.argv[1]
    quick = "--quick" in sys.argv[2:]
    tmp = tempfile.mkdtemp(prefix="dtrain_mesh_")
    try:
        write_words(os.path.join(tmp, "data.txt"), 11)
        outs = equivalence(dtrain, tmp, quick)
        if not quick:
            memory(outs["pp 2 x tp 2 x cp 2"])
            dry_run(dtrain, tmp, outs["pp 2 x tp 2 x cp 2"])
            banner(dtrain, tmp)
            checkpoints(dtrain, tmp)
            spellings(dtrain, tmp)
            bad_input(dtrain, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
