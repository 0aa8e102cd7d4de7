"""What the multi-rank Python tests share: running the dtrain binary, a
small word corpus, bit-for-bit comparison of weights, and the refusal loop
for bad input."""
import json
import math
import os
import random
import re
import subprocess

import torch

from checks import check
from dtrain_ref import st_read

WORDS = ("the quick brown fox jumps over the lazy dog while seven wizards quietly "
         "judge boxing matches").split()


def run(dtrain, args, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([dtrain] + args, capture_output=True, text=True, timeout=timeout, env=e)


def train_logged(dtrain, args, log, final, env=None):
    """Runs `dtrain` + args (which write --log-json log and --save-final
    final); stops the test with the run's output when it fails. Returns the
    logged steps, the final weights and stdout."""
    r = run(dtrain, args, env)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        raise SystemExit("dtrain %s failed" % " ".join(args))
    entries = [json.loads(l) for l in open(log) if '"loss"' in l]
    return entries, st_read(final)[0], r.stdout


def ranks_of(launcher):
    """{RANK: pid} of the launcher's live children."""
    out = {}
    try:
        kids = open("/proc/%d/task/%d/children" % (launcher, launcher)).read().split()
    except OSError:
        return out
    for pid in map(int, kids):
        try:
            env = open("/proc/%d/environ" % pid, "rb").read().split(b"\0")
            state = open("/proc/%d/stat" % pid).read().split(")")[-1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                out[int(kv[5:])] = pid
    return out


def logged(log):
    """The steps a --log-json file holds so far."""
    try:
        return sum(1 for l in open(log) if '"loss"' in l)
    except OSError:
        return 0


def write_words(path, seed, n=30000):
    rng = random.Random(seed)
    with open(path, "w") as f:
        f.write(" ".join(rng.choice(WORDS) for _ in range(n)))


def same_bits(a, b):
    """Two {name: tensor} dicts hold the same names and the same bits."""
    return a.keys() == b.keys() and all(a[k].view(-1).equal(b[k].view(-1)) for k in a)


def expect_refused(dtrain, base, cases):
    """Each (args, text): base + args exits non-zero with text in its output."""
    for args, want in cases:
        r = run(dtrain, base + args, timeout=60)
        msg = r.stderr + r.stdout
        check(r.returncode != 0 and want in msg,
              "%s: refused naming %r (exit %d: %s)" % (" ".join(args), want, r.returncode,
                                                       msg.strip().splitlines()[-1:]))


def _sq_sums(x, y, chunk=1 << 20):
    """sum((x - y)^2) and sum(y^2) over two flat fp32 tensors, in fp64, a
    chunk at a time: fp64 copies of whole GPT-2-sized weights would be
    hundreds of MiB of fresh pages per tensor."""
    num = den = 0.0
    for i in range(0, y.numel(), chunk):
        xd, yd = x[i:i + chunk].double(), y[i:i + chunk].double()
        num += (xd - yd).square().sum().item()
        den += yd.square().sum().item()
    return num, den


def rel_err(a, b, lr, steps):
    """The worst tensor's ||a - b|| / ||b||, and its name. The key third of
    c_attn.bias is left out: softmax ignores it, so its true gradient is
    zero and what arrives is rounding noise, which Adam scales up to steps
    of lr whatever its size (so it is checked apart, within 2 lr a step)."""
    worst, name = 0.0, ""
    for k in b:
        if k not in a or a[k].shape != b[k].shape:
            return math.inf, "%s (shape %s, expected %s)" % (
                k, tuple(a[k].shape) if k in a else "missing", tuple(b[k].shape))
        x, y = a[k].reshape(-1), b[k].reshape(-1)
        if k.endswith("c_attn.bias"):
            C = y.numel() // 3
            check((x[C:2 * C].double() - y[C:2 * C].double()).abs().max().item()
                  <= 2 * lr * steps, "%s: key part within 2 lr per step" % k)
            x, y = torch.cat([x[:C], x[2 * C:]]), torch.cat([y[:C], y[2 * C:]])
        num, den = _sq_sums(x, y)
        d = math.sqrt(num) / max(math.sqrt(den), 1e-30)
        if d > worst:
            worst, name = d, k
    return worst, name


def train_small(dtrain, tmp, name, model, extra, steps, lr):
    """A short run of the tests' small GPT (model: its --n-layer ... flags)
    on tmp/data.txt, AdamW with weight decay, clipping at 1, no shuffling,
    one thread, evaluated on 2 batches at the end. Returns the logged
    losses, the final weights, stdout, the final validation loss (or None)
    and the logged steps."""
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".safetensors")
    args = ["train", "--data", os.path.join(tmp, "data.txt")] + model + [
        "--steps", str(steps), "--lr-schedule", "constant", "--weight-decay", "0.1",
        "--grad-clip", "1", "--shuffle", "0", "--threads", "1", "--log-json", log,
        "--save-final", final, "--lr", str(lr), "--print-every", "100",
        "--eval-batches", "2"] + extra
    entries, weights, out = train_logged(dtrain, args, log, final)
    val = re.findall(r"val loss ([0-9.]+)", out)
    return [e["loss"] for e in entries], weights, out, float(val[-1]) if val else None, entries


def close_to_one(got, ref, what, lr, steps, loss_tol=1e-6, w_tol=1e-5):
    """A parallel run (train_small's result) against one process's: every
    logged loss within loss_tol relative, the worst tensor within w_tol,
    the final validation loss within loss_tol."""
    worst = max(abs(a - b) / abs(b) for a, b in zip(got[0], ref[0]))
    err, where = rel_err(got[1], ref[1], lr, steps)
    check(len(got[0]) == len(ref[0]) and worst <= loss_tol and err <= w_tol,
          "%s: losses within %g of one process's (worst %.2e), weights within %g (worst "
          "%.2e, %s)" % (what, loss_tol, worst, w_tol, err, where))
    if ref[3] is not None:
        check(got[3] is not None and abs(got[3] - ref[3]) <= loss_tol * ref[3] + 1e-4,
              "%s: final validation loss %s, one process %.4f" % (what, got[3], ref[3]))
