"""What the multi-rank Python tests share: running the dtrain binary, a
small word corpus, bit-for-bit comparison of weights, and the refusal loop
for bad input."""
import json
import os
import random
import subprocess

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


def rel_err(a, b, lr, steps):
    """The worst tensor's ||a - b|| / ||b||, and its name. The key third of
    c_attn.bias is left out: softmax ignores it, so its true gradient is
    zero and what arrives is rounding noise, which Adam scales up to steps
    of lr whatever its size (so it is checked apart, within 2 lr a step)."""
    worst, name = 0.0, ""
    for k in b:
        x, y = a[k].double(), b[k].double()
        if k.endswith("c_attn.bias"):
            C = y.numel() // 3
            check((x[C:2 * C] - y[C:2 * C]).abs().max().item() <= 2 * lr * steps,
                  "%s: key part within 2 lr per step" % k)
            keep = list(range(C)) + list(range(2 * C, 3 * C))
            x, y = x[keep], y[keep]
        d = (x - y).norm().item() / max(y.norm().item(), 1e-30)
        if d > worst:
            worst, name = d, k
    return worst, name
