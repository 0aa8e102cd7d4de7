"""Learning, measured against a known answer: text from a random order-2
Markov chain over a few byte values, whose entropy rate H (nats per token)
is computed exactly here. Trained on it, the model's validation loss must
come within 0.05 nats of H.

  test_learning.py DTRAIN
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from markov import K, make_chain, entropy_rate, sample  # noqa: E402


def main():
    dtrain = sys.argv[1]
    rng = np.random.default_rng(12345)
    P = make_chain(rng)
    H = entropy_rate(P)
    with tempfile.TemporaryDirectory() as tmp:
        train, val = os.path.join(tmp, "train.txt"), os.path.join(tmp, "val.txt")
        open(train, "wb").write(sample(P, 400000, rng))
        open(val, "wb").write(sample(P, 70000, rng))
        log = os.path.join(tmp, "log.json")
        # T = 128: only the first two positions of a sequence lack the full
        # context, which costs less than 0.02 nats on average.
        r = subprocess.run([dtrain, "train", "--data", train, "--val-data", val,
                            "--n-layer", "2", "--n-head", "4", "--n-embd", "64",
                            "--block-size", "64", "--batch-size", "16", "--steps", "1500",
                            "--lr", "3e-3", "--warmup-steps", "50", "--lr-schedule", "cosine",
                            "--weight-decay", "0", "--eval-batches", "64", "--eval-every", "300",
                            "--seed", "1", "--log-json", log, "--print-every", "50"],
                           capture_output=True, text=True)
        print(r.stdout[-2000:], r.stderr[-2000:])
        if r.returncode != 0:
            sys.exit("dtrain train failed")
        evals = [json.loads(l)["val_loss"] for l in open(log) if "val_loss" in l]
    final = evals[-1]
    print("entropy rate %.4f nats, unigram entropy %.4f; validation losses %s"
          % (H, np.log(K), " ".join("%.4f" % v for v in evals)))
    ok = final - H < 0.05 and final > H - 0.02
    print(("ok    " if ok else "FAIL  ")
          + "validation loss %.4f within 0.05 nats of the entropy rate %.4f" % (final, H))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
