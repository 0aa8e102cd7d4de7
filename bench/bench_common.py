"""What the training benchmarks share: the reference configuration
(REFERENCE.md: GPT L6 H6 C384 T256 V256, batch 8), arguments, a corpus
file, the dtrain command line, and means over a JSON log."""
import argparse
import json
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYLIB = os.path.join(ROOT, "tests", "pylib")
L, H, C, T, V, B = 6, 6, 384, 256, 256, 8


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(ROOT, "build", "dtrain"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the means")
    return ap.parse_args()


def write_corpus(path, ntokens):
    """Random words, at least ntokens bytes: every step reads fresh data."""
    rng = random.Random(0)
    words = ["tok%d" % i for i in range(500)]
    with open(path, "w") as f:
        f.write(" ".join(rng.choice(words) for _ in range(ntokens // 4 + 1)))


def dtrain_cmd(dtrain, data, steps, log, *extra):
    return [dtrain, "train", "--model", "bench", "--data", data, "--steps", str(steps),
            "--batch-size", str(B), "--eval-batches", "0", "--shuffle", "0",
            "--lr-schedule", "constant", "--print-every", "1000000", "--log-json", log] + list(extra)


def log_means(log, skip, *keys):
    """Means of keys over the logged steps after the first `skip`."""
    entries = [json.loads(l) for l in open(log) if '"loss"' in l][skip:]
    return [sum(e.get(k, 0) for e in entries) / len(entries) for k in keys]
