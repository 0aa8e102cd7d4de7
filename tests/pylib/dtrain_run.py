"""What the multi-rank Python tests share: running the dtrain binary, a
small word corpus, bit-for-bit comparison of weights, and the refusal loop
for bad input."""
import os
import random
import subprocess

from checks import check

WORDS = ("the quick brown fox jumps over the lazy dog while seven wizards quietly "
         "judge boxing matches").split()


def run(dtrain, args, env=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([dtrain] + args, capture_output=True, text=True, timeout=timeout, env=e)


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
