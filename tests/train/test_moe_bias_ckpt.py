"""The experts' bias of aux-loss-free balancing (--moe-router-enable-expert-bias)
travels in checkpoints: a run stopped and resumed ends on the bits of the run
that never stopped.

  test_moe_bias_ckpt.py DTRAIN

A small model (2 layers, 4 experts, top 2) trains 4 steps with the bias
moved by 1.0 a step, far more than the router's probabilities (< 1), so the
bias decides which experts a token meets. The reference is one process with
--grad-accum 2, uninterrupted, saving at steps 2 and 4.

- one process saves at step 2 and resumes there; DDP and ZeRO-2 over 2
  ranks save at step 2 (a whole-model checkpoint, a sharded one) and one
  process with --grad-accum 2 resumes each: the reference's final weights
  and its step-4 bias, bit for bit;
- the step-2 bias is not zero, `ckpt info` prints it, and a resume from
  the same checkpoint with the bias taken out of its state (so it starts
  at zero, with a warning) ends elsewhere: the bias is what made the bits;
- `dtrain sample` routes with a checkpoint's bias: the text differs from
  the same checkpoint's with the bias taken out, which equals the text of
  its `--save-final` weights file (same weights, no bias; the file records
  its top K in its metadata). A file without that record is refused
  unless --moe-router-topk is given, and then samples the same text.
- refused, naming the file and the counts: a layer's string one value
  short, and a resume without --moe-router-enable-expert-bias.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_ref import st_read, st_write  # noqa: E402
from dtrain_run import run, same_bits, write_words  # noqa: E402

L, E = 2, 4


def args(tmp, steps, extra, bias=True):
    return ["train", "--num-experts", str(E), "--n-layer", str(L), "--batch-size", "2",
            "--seq-len", "32", "--threads", "1", "--eval-batches", "0", "--steps", str(steps),
            "--lr-schedule", "constant", "--data", os.path.join(tmp, "words.txt")] + (
            ["--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "1"]
            if bias else []) + extra


def train(dtrain, tmp, name, ranks, steps, extra):
    """Runs and returns (the process's result, the final weights or None)."""
    final = os.path.join(tmp, name + ".st")
    a = args(tmp, steps, extra + ["--save-final", final])
    r = run(dtrain, ["launch", "-n", str(ranks), dtrain] + a if ranks > 1 else a)
    check(r.returncode == 0, "%s: trained%s" % (name, "" if r.returncode == 0 else
                                                  " (%s)" % (r.stdout + r.stderr)[-400:]))
    return r, st_read(final)[0] if r.returncode == 0 else None


def state_of(ckpt):
    """A checkpoint's state object: state.json's, or the manifest's ({}
    when there is neither)."""
    path, man = os.path.join(ckpt, "state.json"), os.path.join(ckpt, "manifest.json")
    if os.path.exists(path):
        return json.load(open(path))
    return json.load(open(man))["state"] if os.path.exists(man) else {}


def bias_of(ckpt):
    """The recorded bias as floats per layer, or None."""
    words = state_of(ckpt).get("moe_expert_bias")
    if words is None:
        return None
    return [[struct.unpack("<f", bytes.fromhex(w)[::-1])[0] for w in s.split(" ")]
            for s in words]


def check_resumes(dtrain, tmp, ref_final, ref_bias4):
    """Saved at step 2 by 1 or 2 ranks, resumed by one process: the
    reference's bits."""
    one = ["--grad-accum", "2"]
    saves = (("one process", 1, one), ("DDP 2 ranks", 2, []),
             ("ZeRO-2 2 ranks", 2, ["--zero-stage", "2"]))
    for name, ranks, extra in saves:
        tag = name.split()[0]
        out = os.path.join(tmp, "ck_" + tag)
        train(dtrain, tmp, "save_" + tag, ranks, 2, extra + ["--out", out])
        ck2 = os.path.join(out, "ckpt-00000002")
        if tag == "ZeRO-2":
            check(os.path.exists(os.path.join(ck2, "manifest.json")), "ZeRO-2: sharded")
        r, got = train(dtrain, tmp, "resume_" + tag, 1, 4, one + ["--resume", "--out", out])
        check(got is not None and same_bits(got, ref_final),
              "%s saved at step 2, one process resumed: the uninterrupted run's final "
              "weights, bit for bit" % name)
        bias4 = bias_of(os.path.join(out, "ckpt-00000004"))
        check(bias4 is not None and bias4 == ref_bias4,
              "%s: the step-4 bias is the uninterrupted run's" % name)


def check_bias_matters(dtrain, tmp, ref, ref_final):
    """Without the saved bias the resumed run is another run; ckpt info
    shows the bias."""
    bias2 = bias_of(os.path.join(ref, "ckpt-00000002"))
    check(bias2 is not None and any(v != 0 for layer in bias2 for v in layer) and
          len(bias2) == L and all(len(b) == E for b in bias2),
          "the step-2 checkpoint records a bias of %d x %d, not all zero: %s" % (L, E, bias2))
    if bias2 is None:
        return
    info = run(dtrain, ["ckpt", "info", os.path.join(ref, "ckpt-00000002")])
    lines = ["  layer %d: %s" % (l, " ".join("%.9g" % v for v in bias2[l])) for l in range(L)]
    check(info.returncode == 0 and all(ln in info.stdout.splitlines() for ln in lines),
          "ckpt info prints each layer's bias: %s" % " / ".join(lines))
    zeroed = os.path.join(tmp, "zeroed")
    shutil.copytree(os.path.join(ref, "ckpt-00000002"), zeroed)
    st = json.load(open(os.path.join(zeroed, "state.json")))
    del st["moe_expert_bias"]
    json.dump(st, open(os.path.join(zeroed, "state.json"), "w"))
    r, got = train(dtrain, tmp, "zeroed", 1, 4, ["--grad-accum", "2", "--resume=" + zeroed])
    check("holds no experts' bias" in r.stderr and "starts at zero" in r.stderr,
          "a checkpoint without the bias warns that it starts at zero")
    check(got is not None and not same_bits(got, ref_final),
          "resumed with the bias zeroed, the final weights differ from the uninterrupted run's")


def sample(dtrain, path, extra=()):
    """The text as bytes (a byte-level model's need not be UTF-8), stderr as text."""
    r = subprocess.run([dtrain, "sample", "--ckpt", path, "--tokens", "48", "--seed", "3",
                        "--prompt", "the "] + list(extra), capture_output=True, timeout=120)
    r.stderr = r.stderr.decode(errors="replace")
    return r


def check_sample(dtrain, tmp, ref):
    ck4 = os.path.join(ref, "ckpt-00000004")
    nobias = os.path.join(tmp, "nobias4")
    shutil.copytree(ck4, nobias)
    st = json.load(open(os.path.join(nobias, "state.json")))
    st.pop("moe_expert_bias", None)
    json.dump(st, open(os.path.join(nobias, "state.json"), "w"))
    with_bias, without, final = (sample(dtrain, p) for p in (ck4, nobias,
                                                              os.path.join(tmp, "ref.st")))
    check(with_bias.returncode == 0 and without.returncode == 0 and
          with_bias.stdout != without.stdout,
          "sample from a checkpoint routes with its bias: the text differs without it (%r / %r)"
          % (with_bias.stdout[:60], without.stdout[:60]))
    check(final.returncode == 0 and final.stdout == without.stdout,
          "sample from the --save-final file (top K from its metadata) is the text of the "
          "checkpoint without its bias (%s)" % (final.stderr.strip()[-200:] or final.stdout[:60]))
    tensors, meta = st_read(os.path.join(tmp, "ref.st"))
    bare = os.path.join(tmp, "bare.st")
    st_write(bare, tensors, {k: v for k, v in meta.items() if k != "moe_router_topk"})
    r = sample(dtrain, bare)
    check(r.returncode != 0 and "does not record its experts' top K" in r.stderr and
          "--moe-router-topk" in r.stderr, "a file without its top K is refused, naming the "
          "flag (%s)" % r.stderr.strip()[-200:])
    r = sample(dtrain, bare, ["--moe-router-topk", "2"])
    check(r.returncode == 0 and r.stdout == without.stdout, "with --moe-router-topk 2: the "
          "same text")


def check_refusals(dtrain, tmp, ref):
    bad = os.path.join(tmp, "short")
    shutil.copytree(os.path.join(ref, "ckpt-00000002"), bad)
    path = os.path.join(bad, "state.json")
    st = json.load(open(path))
    if "moe_expert_bias" not in st:
        return
    st["moe_expert_bias"][1] = st["moe_expert_bias"][1][:-9]
    json.dump(st, open(path, "w"))
    r = run(dtrain, args(tmp, 4, ["--grad-accum", "2", "--resume=" + bad]))
    want = '%s: "moe_expert_bias"[1] holds 3 values; the model has 4 experts a layer' % path
    check(r.returncode != 0 and want in r.stderr, "a layer one value short is refused naming "
          "the file and both counts (%s)" % r.stderr.strip()[-300:])
    ck2 = os.path.join(ref, "ckpt-00000002")
    r = run(dtrain, args(tmp, 4, ["--grad-accum", "2", "--resume=" + ck2], bias=False))
    check(r.returncode != 0 and "holds the experts' bias" in r.stderr and
          "--moe-router-enable-expert-bias" in r.stderr,
          "a resume without --moe-router-enable-expert-bias is refused, naming it (%s)"
          % r.stderr.strip()[-300:])


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        write_words(os.path.join(tmp, "words.txt"), 5)
        ref = os.path.join(tmp, "ref")
        _, ref_final = train(dtrain, tmp, "ref", 1, 4,
                             ["--grad-accum", "2", "--out", ref, "--save-every", "2"])
        ref_bias4 = bias_of(os.path.join(ref, "ckpt-00000004"))
        check(ref_final is not None and ref_bias4 is not None, "the reference saved its bias")
        if ref_final is None:
            finish()
            return
        check_resumes(dtrain, tmp, ref_final, ref_bias4)
        check_bias_matters(dtrain, tmp, ref, ref_final)
        check_refusals(dtrain, tmp, ref)
        check_sample(dtrain, tmp, ref)
    finish()


if __name__ == "__main__":
    main()
