"""ZeRO checkpoints through the trainer: saved in shards, resumed at
another rank count and stage.

  test_zero_reshard.py DTRAIN

The reference trains 12 steps at 4 ranks with ZeRO-3 (batch 2 per rank, a
global batch of 8, constant lr, --shuffle 0). Another run stops at step 8
with a checkpoint (one shard per rank and a manifest). From it:
  - at the same layout, 4 ranks with ZeRO-3: the last 4 steps and the final
    weights are the reference's, bit for bit;
  - at 2 ranks with ZeRO-1 (batch 2, accumulation 2) and at 1 rank without
    ZeRO (accumulation 4): the last 4 losses within 1e-6 of the reference's;
  - `dtrain ckpt consolidate` writes Hugging Face safetensors that load in
    PyTorch and equal the weights the step-8 run gathered (--save-final);
    `dtrain ckpt info` names the layout; `dtrain sample` reads it;
  - a checkpoint with a shard missing is refused, naming the shard, and
    the run's directory is left as it was.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_ref import st_read  # noqa: E402


def run(dtrain, args, timeout=300):
    return subprocess.run([dtrain] + args, capture_output=True, text=True, timeout=timeout)


def train(dtrain, tmp, name, extra, must=True):
    log = os.path.join(tmp, name + ".json")
    args = ["train", "--data", os.path.join(tmp, "data.txt"), "--val-fraction", "0",
            "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
            "--batch-size", "2", "--lr-schedule", "constant", "--lr", "3e-3", "--grad-clip", "1",
            "--shuffle", "0", "--threads", "1", "--eval-batches", "0", "--print-every", "100",
            "--log-json", log] + extra
    r = run(dtrain, args)
    if must and r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        raise SystemExit("dtrain train %s failed" % " ".join(extra))
    losses = {}
    if os.path.exists(log):
        for line in open(log):
            e = json.loads(line)
            if "loss" in e:
                losses[e["step"]] = e["loss"]
    return r, losses


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        import random
        rng = random.Random(5)
        words = "one two three four five six seven eight nine ten".split()
        with open(os.path.join(tmp, "data.txt"), "w") as f:
            f.write(" ".join(rng.choice(words) for _ in range(20000)))
        _, ref = train(dtrain, tmp, "ref", ["--nproc", "4", "--zero-stage", "3", "--steps", "12",
                                            "--save-final", os.path.join(tmp, "ref.st")])
        out = os.path.join(tmp, "run")
        at8 = os.path.join(tmp, "at8.st")
        train(dtrain, tmp, "first", ["--nproc", "4", "--zero-stage", "3", "--steps", "8",
                                     "--out", out, "--save-final", at8])
        ckpt = os.path.join(out, "ckpt-00000008")
        check(os.path.exists(os.path.join(ckpt, "manifest.json")) and
              all(os.path.exists(os.path.join(ckpt, "shard-%05d-of-00004.safetensors" % r))
                  for r in range(4)), "the step-8 checkpoint holds a manifest and 4 shards")
        copies = {}
        for name in ("same", "two", "one", "bad"):
            copies[name] = os.path.join(tmp, "run_" + name)
            shutil.copytree(out, copies[name])

        r, got = train(dtrain, tmp, "same", ["--nproc", "4", "--zero-stage", "3", "--steps", "12",
                                             "--out", copies["same"], "--resume", "--save-final",
                                             os.path.join(tmp, "same.st")])
        check([got.get(s) for s in range(8, 12)] == [ref[s] for s in range(8, 12)],
              "resumed at the same layout: steps 9-12 equal the uninterrupted run's")
        a, _ = st_read(os.path.join(tmp, "same.st"))
        b, _ = st_read(os.path.join(tmp, "ref.st"))
        check(a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a),
              "resumed at the same layout: final weights bit-identical")

        for name, flags in (("two", ["--nproc", "2", "--zero-stage", "1", "--grad-accum", "2"]),
                            ("one", ["--grad-accum", "4"])):
            r, got = train(dtrain, tmp, name, flags + ["--steps", "12", "--out", copies[name],
                                                       "--resume"])
            check("resumed from" in r.stdout, "%s: resumed from the sharded checkpoint" % name)
            worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in range(8, 12)) \
                if all(s in got for s in range(8, 12)) else float("inf")
            check(worst <= 1e-6, "resumed at %s: steps 9-12 within 1e-6 of the 4-rank run's "
                  "(worst %.2e)" % (" ".join(flags), worst))

        info = run(dtrain, ["ckpt", "info", ckpt])
        check(info.returncode == 0 and "stage 3" in info.stdout and "4" in info.stdout,
              "ckpt info names the layout: %s" % info.stdout.strip().splitlines()[:3])
        whole = os.path.join(tmp, "whole.safetensors")
        c = run(dtrain, ["ckpt", "consolidate", ckpt, "--out", whole])
        check(c.returncode == 0, "ckpt consolidate: %s" % c.stderr.strip())
        import torch
        got_w, _ = st_read(whole)
        want_w, _ = st_read(at8)
        check(all(isinstance(v, torch.Tensor) for v in got_w.values()) and
              got_w.keys() == want_w.keys() and all(got_w[k].equal(want_w[k]) for k in want_w),
              "consolidated weights load in PyTorch and equal the gathered weights at step 8")

        smp = subprocess.run([dtrain, "sample", "--ckpt", ckpt, "--prompt", "one", "--tokens",
                              "8", "--seed", "1"], capture_output=True, timeout=120)
        check(smp.returncode == 0 and smp.stdout.startswith(b"one"),
              "dtrain sample reads the sharded checkpoint: %s" %
              (smp.stderr.decode(errors="replace").strip() or "ok"))

        bad = os.path.join(copies["bad"], "ckpt-00000008")
        os.remove(os.path.join(bad, "shard-00002-of-00004.safetensors"))
        before = sorted(os.listdir(copies["bad"]))
        r, _ = train(dtrain, tmp, "bad", ["--nproc", "2", "--zero-stage", "2", "--steps", "12",
                                          "--out", copies["bad"], "--resume"], must=False)
        msg = r.stderr + r.stdout
        check(r.returncode != 0 and "shard-00002-of-00004" in msg,
              "a missing shard is refused, naming it: %s" % msg.strip().splitlines()[-1:])
        check(sorted(os.listdir(copies["bad"])) == before and
              open(os.path.join(copies["bad"], "latest")).read().strip() == "ckpt-00000008",
              "the run's directory is left as it was")
    finish()


if __name__ == "__main__":
    main()
