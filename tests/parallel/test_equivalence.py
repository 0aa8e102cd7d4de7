"""Every data-parallel strategy against single-process training of the
same global batch.

  test_equivalence.py DTRAIN [--quick]

The reference is one process with --grad-accum N (the same global batch,
the same sequences in the same order with --shuffle 0). Against it, over 5
steps with AdamW and with SGD, every logged loss and the final weights
hold the same bits where the ranks' gradients are summed in rank order,
as the process sums its micro-batches (each rank weighs its tokens by the
global batch's count, and a later micro-batch's gradient is formed apart
and added once: model/gpt.h):
  - DDP at 2 ranks (--nproc 2, batch B per rank; a + b = b + a, so any
    algorithm), and at 3 and 4 ranks with the rank-order all-reduce
    (--comm-algo allreduce=naive);
  - naive data parallelism at 2 and 3 devices (--strategy dp --devices N);
  - the synchronous parameter server with 2 workers and 1 or 2 servers.
DDP at 3 and 4 ranks with the default (ring) all-reduce sums each chunk
starting at another rank: losses and weights within 1e-5 relative.
The multi-rank runs check themselves that every rank ends with
bit-identical weights (they fail otherwise), and print it; the test checks
the line. Traffic per step, from the JSON log: DDP's ring all-reduce sends
2(n-1)/n of the gradient bytes; a parameter-server worker pushes its
gradient once; the main device of naive DP copies the parameters out and
the gradients in, (N-1) x 2 x the gradient bytes.

--quick, for the sanitizer builds: AdamW only, and one run of each kind of
thread and rank (DDP at 2 ranks, the rank-order all-reduce at 3, naive DP
at 3 devices, the parameter server with 2 servers), 6 runs of the 20.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import same_bits, train_logged  # noqa: E402



def train(dtrain, tmp, name, extra):
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".safetensors")
    args = ["train", "--data", os.path.join(tmp, "data.txt"), "--val-fraction", "0",
            "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
            "--batch-size", "2", "--steps", "5", "--lr-schedule", "constant",
            "--weight-decay", "0.1", "--grad-clip", "1", "--shuffle", "0", "--threads", "1",
            "--log-json", log, "--save-final", final, "--lr", "3e-3"] + extra
    return train_logged(dtrain, args, log, final)


def weights_error(got_w, ref_w, what, elementwise):
    """The worst tensor's error: max |a - b| / max |b| (elementwise), or
    ||a - b|| / ||b||."""
    worst, worst_k = 0.0, ""
    for k in ref_w:
        a, b = got_w[k], ref_w[k]
        if k.endswith("c_attn.bias") and not elementwise:
            C = b.numel() // 3
            check((a[C:2 * C] - b[C:2 * C]).abs().max().item() <= 2 * 3e-3 * 5,
                  "%s: %s key part within 2 lr per step" % (what, k))
            keep = list(range(C)) + list(range(2 * C, 3 * C))
            a, b = a[keep], b[keep]
        if elementwise:
            e = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
        else:
            e = (a - b).norm().item() / max(b.norm().item(), 1e-30)
        if e > worst:
            worst, worst_k = e, k
    return worst, worst_k


REFS = {}


def reference(dtrain, tmp, n, extra):
    key = (n, tuple(extra))
    if key not in REFS:
        REFS[key] = train(dtrain, tmp, "single%d_%d" % (n, len(REFS)), ["--grad-accum", str(n)] + extra)
    return REFS[key]


def compare(dtrain, tmp, how, n, opt):
    """how: (label, flags, multirank, bytes per step as a multiple of the
    gradient bytes, or None: not checked; the same bits as one process)."""
    label, flags, multirank, traffic, exact = how
    extra = ["--optimizer", opt] + (["--momentum", "0.9", "--lr", "0.1"] if opt == "sgd" else [])
    ref, ref_w, _ = reference(dtrain, tmp, n, extra)
    got, got_w, out = train(dtrain, tmp, "%s%s" % (label.replace(" ", "_").replace(",", ""), opt),
                            flags + extra)
    what = "%s, %s" % (label, opt)
    if exact:
        check(len(got) == 5 and [e["loss"] for e in got] == [e["loss"] for e in ref],
              "%s: every loss the bits of one process's" % what)
        check(same_bits(got_w, ref_w), "%s: final weights the bits of one process's" % what)
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(got, ref))
    check(len(got) == 5 and worst < 1e-5,
          "%s: losses within 1e-5 of one process (worst %.1e)" % (what, worst))
    # SGD is held element by element. Adam divides each gradient by its own
    # running scale, so an element whose gradient is mostly rounding noise
    # (the key bias has a true gradient of zero) moves by up to lr on either
    # side whatever the summation order: Adam's weights are compared per
    # tensor, by norm, and the key part of c_attn.bias only to 2 lr per step.
    e, k = weights_error(got_w, ref_w, what, elementwise=(opt == "sgd"))
    check(e < 1e-5, "%s: final weights within 1e-5 %s (worst %.1e in %s)"
          % (what, "element-wise" if opt == "sgd" else "by tensor norm", e, k))
    if multirank:
        check("hold bit-identical weights" in out, "%s: replicas bit-identical" % what)
    if traffic is None:
        return
    grad_bytes = sum(t.numel() for t in ref_w.values()) * 4
    want = traffic * grad_bytes
    sent = [e["bytes_sent"] for e in got]
    rel = max(abs(s - want) / want for s in sent)
    check(rel < 0.05, "%s: %.0f bytes moved per step; expected %.3f x %d gradient bytes = %.0f "
          "(off by %.2f%%)" % (what, sent[-1], traffic, grad_bytes, want, 100 * rel))


QUICK = ("DDP 2 ranks", "DDP 3 ranks, rank-order all-reduce", "naive DP 3 devices",
         "PS sync, 2 workers, 2 servers")


def strategies():
    """(data-parallel size, (label, flags, multirank, traffic, exact))."""
    for n in (2, 3, 4):
        yield n, ("DDP %d ranks" % n, ["--nproc", str(n), "--bucket-mb", "0.01"], True,
                  2 * (n - 1) / n, n == 2)
    for n in (3, 4):
        yield n, ("DDP %d ranks, rank-order all-reduce" % n,
                  ["--nproc", str(n), "--bucket-mb", "0.01", "--comm-algo", "allreduce=naive"],
                  True, None, True)
    for n in (2, 3):
        yield n, ("naive DP %d devices" % n, ["--strategy", "dp", "--devices", str(n)], False,
                  2 * (n - 1), True)
    for s in (1, 2):
        yield 2, ("PS sync, 2 workers, %d server%s" % (s, "s" if s > 1 else ""),
                  ["--strategy", "ps", "--servers", str(s), "--nproc", str(2 + s)], True, 1.0,
                  True)


def main():
    dtrain, quick = sys.argv[1], sys.argv[2:] == ["--quick"]
    with tempfile.TemporaryDirectory() as tmp:
        words = "red green blue cyan magenta yellow black white grey brown".split()
        import random
        random.seed(4)
        with open(os.path.join(tmp, "data.txt"), "w") as f:
            f.write(" ".join(random.choice(words) for _ in range(20000)))
        for n, how in strategies():
            if quick and how[0] not in QUICK:
                continue
            for opt in ("adamw",) if quick else ("adamw", "sgd"):
                compare(dtrain, tmp, how, n, opt)
    finish()


if __name__ == "__main__":
    main()
