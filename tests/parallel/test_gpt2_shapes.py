"""Every strategy at GPT-2's sizes, against one process on the same global
batch.

  test_gpt2_shapes.py DTRAIN

The other tests run small models whose sizes divide evenly (a vocabulary
of 256, widths of 32 or 48); tensor parallelism passed them all and failed
at step 1 on GPT-2's vocabulary of 50257. Here every strategy runs the
`gpt2` preset's shapes (vocabulary 50257 = 29 x 1733, which no tp divides;
768 wide, 12 heads, a block of 1024) at 2 layers (a pipeline needs 2),
sequences of 32, one sequence per micro-batch, 2 steps with weight decay
and clipping at 1 (the norm at step 1 is 6 to 8: the clipping, so the
norm, moves every weight). Every run starts from one weights file in
Hugging Face's names (`--init`, as a user starting from GPT-2 does), of
which each rank reads its part. The data is a token shard whose tokens
cover the whole vocabulary, so every vocabulary slice holds targets.

Each layout, its ranks, its global batch (sequences) and why these sizes:
  - DDP, 2 ranks, batch 2: every segment is a bucket over --bucket-mb's
    25 MiB (a layer 27 MiB, the embeddings 150 MiB). Bit-identical.
  - naive DP, 3 devices, batch 3: three replicas in one process.
    Bit-identical.
  - parameter server, 2 workers and 2 servers, batch 2: the servers'
    shards cut the flat buffer inside a segment. Bit-identical.
  - ZeRO-1 and ZeRO-2, 2 ranks, batch 2: ZeRO pads each segment to a
    multiple of 2 x 1024 floats, and none is one (the embeddings are
    51281 x 768 floats), so the last rank's piece of each holds padding.
    Bit-identical.
  - ZeRO-3 with the rank-order reduce-scatter, 3 ranks, batch 3: pieces of
    a third, padded the same way. Bit-identical.
  - pipeline 1f1b and zb1p, pp 2, 3 micro-batches: M not a multiple of the
    stages, wte on both ends. Within 1e-5; zb1p gives 1f1b's bits.
  - tensor parallelism, tp 3 (vocabulary slices of 16753, 16753 and
    16751 rows; 4 heads a rank), accumulating the batch of 3. Within 1e-5.
  - sequence parallelism, tp 2, batch 2: 32 rows a micro-batch, 16 a
    rank, vocabulary slices of 25129 and 25128 rows. Within 1e-5.
  - context parallelism, cp 2, batch 2, ring (zig-zag chunks of 8
    positions) and Ulysses (6 of the 12 heads a rank). Within 1e-5.
  - the mesh, tp 2 x dp 2 with ZeRO-2, batch 2: ZeRO's pieces of unequal
    vocabulary slices. Within 1e-5.

Bit-identical where docs/design.md ("Exactness") promises it, with AdamW:
every logged loss, every step's gradient norm and the validation loss, and
the final weights. Elsewhere (tensor and context parallelism sum partial
products and softmaxes in another order, a pipeline adds the tied
embedding's two ends once per step), with SGD and momentum: the losses, each step's norm
and the validation loss within 1e-6 relative, the worst tensor's
||a - b|| / ||b|| within 1e-5. (Not AdamW there: its first steps divide
each element by its own gradient's size, which turns the gradients'
rounding into weight differences as large as one process's own: against
an fp64 PyTorch run of the same 2 steps, one process's fp32 weights are up
to 1.7e-5 off in a tensor (h.0.ln_1.bias), tp 3's 3.6e-5. SGD carries the
gradients' rounding as it is: 1e-6 here.)
Every multi-rank run must also pass its own replica check (the ranks'
weights the same bits at the end). (tp 2 without sequence parallelism and
DDP accumulating micro-batches run in test_tp.py and test_equivalence.py:
here tp 3 and sp cover the vocabulary's uneven slices, and every one-process
reference accumulates its micro-batches.) Runs are started one at a time; each
rank runs one thread.
"""
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
import torch  # noqa: E402
from dtrain_ref import GPT, shard_write, st_read, st_write  # noqa: E402
from dtrain_run import rel_err, run, same_bits  # noqa: E402

VOCAB, LAYERS, STEPS, SGD_LR = 50257, 2, 2, 0.1
# AdamW where the bits must agree; SGD with momentum where they need not
# (the rounding is then carried to the weights as it is, where Adam's first
# steps scale each element by its own gradient's size).
OPTIMIZERS = {True: ["--optimizer", "adamw", "--lr", "1e-3", "--weight-decay", "0.1"],
              False: ["--optimizer", "sgd", "--momentum", "0.9", "--lr", str(SGD_LR),
                      "--weight-decay", "0.1"]}
MODEL = ["--model", "gpt2", "--n-layer", str(LAYERS), "--seq-len", "32"]

# (label, flags, global batch in sequences, exact). Each rank's micro-batch
# is one sequence; a layout that splits the model and not the batch
# accumulates the global batch's micro-batches.
LAYOUTS = [
    ("DDP 2 ranks", ["--nproc", "2"], 2, True),
    ("naive DP 3 devices", ["--strategy", "dp", "--devices", "3"], 3, True),
    ("PS 2 workers 2 servers", ["--strategy", "ps", "--servers", "2", "--nproc", "4"], 2, True),
    ("ZeRO-1 2 ranks", ["--nproc", "2", "--zero-stage", "1"], 2, True),
    ("ZeRO-2 2 ranks", ["--nproc", "2", "--zero-stage", "2"], 2, True),
    ("ZeRO-3 3 ranks", ["--nproc", "3", "--zero-stage", "3", "--comm-algo",
                        "reduce_scatter=direct"], 3, True),
    ("pp 2 1f1b", ["--nproc", "2", "--pp", "2", "--pp-schedule", "1f1b", "--grad-accum", "3"],
     3, False),
    ("pp 2 zb1p", ["--nproc", "2", "--pp", "2", "--pp-schedule", "zb1p", "--grad-accum", "3"],
     3, False),
    ("tp 3", ["--nproc", "3", "--tp", "3", "--grad-accum", "3"], 3, False),
    ("tp 2 sp", ["--nproc", "2", "--tp", "2", "--sequence-parallel", "--grad-accum", "2"], 2,
     False),
    ("cp 2 ring", ["--nproc", "2", "--cp", "2", "--grad-accum", "2"], 2, False),
    ("cp 2 ulysses", ["--nproc", "2", "--cp", "2", "--cp-algo", "ulysses", "--grad-accum", "2"],
     2, False),
    ("tp 2 x dp 2 ZeRO-2", ["--nproc", "4", "--tp", "2", "--zero-stage", "2"], 2, False),
]


def write_tokens(path):
    """Tokens drawn over the whole vocabulary, its last token among them."""
    tokens = np.random.default_rng(7).integers(0, VOCAB, 20000)
    tokens[100] = VOCAB - 1
    shard_write(path, tokens)


def write_weights(path):
    """Starting weights in Hugging Face's names: every run reads its part."""
    model = GPT(LAYERS, 12, 768, VOCAB, 1024)
    model.init_random(torch.Generator().manual_seed(3))
    st_write(path, model.hf_state(), {"n_head": "12"})


def train(dtrain, tmp, label, extra):
    """One run: (losses, norms, validation loss, final weights, stdout), or
    None where it failed (a failed check names its error)."""
    name = re.sub(r"\W+", "_", label)
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".safetensors")
    args = ["train", "--data", os.path.join(tmp, "tokens.bin"), "--init",
            os.path.join(tmp, "init.safetensors")] + MODEL + [
        "--batch-size", "1", "--steps", str(STEPS), "--lr-schedule", "constant",
        "--grad-clip", "1", "--shuffle", "0", "--threads", "1",
        "--print-every", "100", "--eval-batches", "2", "--log-json", log, "--save-final",
        final] + extra
    r = run(dtrain, args, timeout=600)
    lines = (r.stderr + r.stdout).strip().splitlines()
    check(r.returncode == 0, "%s: trains 2 steps at GPT-2's sizes (exit %d%s)"
          % (label, r.returncode, ": " + lines[0] if r.returncode and lines else ""))
    if r.returncode != 0:
        return None
    entries = [json.loads(l) for l in open(log)]
    weights = st_read(final)[0]
    os.remove(final)
    steps = [e for e in entries if "loss" in e]
    val = [e["val_loss"] for e in entries if "val_loss" in e]
    return ([e["loss"] for e in steps], [e["grad_norm"] for e in steps], val[-1:], weights,
            r.stdout)


def worst_rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b)) if len(a) == len(b) and a else 1.0


def compare(got, ref, what, exact, ranks):
    losses, norms, val, weights, out = got
    if exact:
        check(losses == ref[0] and norms == ref[1] and val == ref[2],
              "%s: every loss, norm and the validation loss the bits of one process's "
              "(%s, %s; one process %s, %s)" % (what, losses, norms, ref[0], ref[1]))
        check(same_bits(weights, ref[3]), "%s: final weights the bits of one process's" % what)
    else:
        check(len(losses) == STEPS and worst_rel(losses, ref[0]) <= 1e-6
              and worst_rel(norms, ref[1]) <= 1e-6 and worst_rel(val, ref[2]) <= 1e-6,
              "%s: losses %s, norms %s and validation loss %s within 1e-6 of one process's "
              "(%s, %s, %s)" % (what, losses, norms, val, ref[0], ref[1], ref[2]))
        err, where = rel_err(weights, ref[3], SGD_LR, STEPS)
        check(err <= 1e-5, "%s: final weights within 1e-5 of one process's (worst %.2e, %s)"
              % (what, err, where))
    if ranks:
        line = re.search(r"^replicas: .*$", out, re.M)
        check(line is not None and "bit-identical" in line.group(0),
              "%s: the run's replica check passed (%s)" % (what, line.group(0) if line else None))


def main():
    dtrain = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="dtrain_gpt2_")
    try:
        write_tokens(os.path.join(tmp, "tokens.bin"))
        write_weights(os.path.join(tmp, "init.safetensors"))
        refs = {(n, exact): train(dtrain, tmp, "one process %d %s" % (n, OPTIMIZERS[exact][1]),
                                  ["--grad-accum", str(n)] + OPTIMIZERS[exact])
                for n, exact in sorted({(batch, exact) for _, _, batch, exact in LAYOUTS})}
        ran = {}
        for label, flags, batch, exact in LAYOUTS:
            got = ran[label] = train(dtrain, tmp, label, flags + OPTIMIZERS[exact])
            if got and refs[batch, exact]:
                compare(got, refs[batch, exact], label, exact, "--nproc" in flags)
        a, b = ran["pp 2 1f1b"], ran["pp 2 zb1p"]
        check(a and b and a[0] == b[0] and same_bits(a[3], b[3]),
              "pp 2 zb1p: losses and final weights the bits of 1f1b's")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
