"""ZeRO++ qwZ (--zero-quantized-weights): stage 3 gathers the parameters as
int8 blocks with one fp32 scale each, against plain stage 3.

  test_zeropp.py DTRAIN

On an order-2 Markov corpus of known entropy rate (tests/pylib/markov.py),
2 ranks, 800 steps: the validation loss with qwZ within 2% of plain stage
3's, and both within 0.1 nats of the entropy rate (both learned). Traffic: each
parameter gather of step 1 (the --trace timeline's allgather events) moves
(1 + 4 / 256) / 4 of fp32's bytes, and the step's bytes sent fall by
(N - 1) / N of the gathers' difference. Every rank's weights the same bits
(each dequantizes the same bytes). Bad input: qwZ below stage 3, with
bf16, and --zero-quant-block without it.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import expect_refused  # noqa: E402
from markov import K, make_chain, entropy_rate, sample  # noqa: E402

STEPS = 800


def train(dtrain, tmp, name, extra):
    log, trace = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".trace.json")
    r = subprocess.run([dtrain, "train", "--data", os.path.join(tmp, "train.txt"), "--val-data",
                        os.path.join(tmp, "val.txt"), "--n-layer", "2", "--n-head", "4",
                        "--n-embd", "64", "--block-size", "64", "--batch-size", "16", "--steps",
                        str(STEPS), "--lr", "3e-3", "--warmup-steps", "50", "--lr-schedule",
                        "cosine", "--eval-batches", "16", "--seed", "1", "--threads", "1",
                        "--nproc", "2", "--zero-stage", "3", "--log-json", log, "--trace",
                        trace, "--print-every", "100"] + extra,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:])
        raise SystemExit("dtrain failed: %s" % name)
    lines = [json.loads(l) for l in open(log)]
    val = [e["val_loss"] for e in lines if "val_loss" in e][-1]
    sent = [e["bytes_sent"] for e in lines if "bytes_sent" in e]
    ev = json.load(open(trace))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    gathers = [e["args"]["bytes"] for e in ev if e.get("name") == "allgather" and
               e.get("pid") == 0 and e["args"].get("step") == 1]
    return val, sent[1], gathers, r.stdout


def main():
    dtrain = sys.argv[1]
    rng = np.random.default_rng(2024)
    P = make_chain(rng)
    H = entropy_rate(P)
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "train.txt"), "wb").write(sample(P, 200000, rng))
        open(os.path.join(tmp, "val.txt"), "wb").write(sample(P, 40000, rng))
        plain = train(dtrain, tmp, "plain", [])
        qwz = train(dtrain, tmp, "qwz", ["--zero-quantized-weights"])
        check(plain[0] < H + 0.1 and qwz[0] < H + 0.1,
              "both learn, to within 0.1 nats of the entropy rate: validation losses %.4f (plain), %.4f (qwZ); unigram entropy %.4f, "
              "entropy rate %.4f" % (plain[0], qwz[0], np.log(K), H))
        check(abs(qwz[0] - plain[0]) <= 0.02 * plain[0],
              "qwZ's validation loss %.4f within 2%% of plain stage 3's %.4f" % (qwz[0], plain[0]))
        want = (1 + 4 / 256) / 4
        ratios = [q / p for q, p in zip(qwz[2], plain[2])]
        check(len(qwz[2]) == len(plain[2]) > 0 and all(abs(r - want) <= 0.002 for r in ratios),
              "each of step 1's %d parameter gathers moves %.4f of fp32's bytes (%s)" %
              (len(ratios), want, sorted(set(round(r, 4) for r in ratios))))
        saved = (sum(plain[2]) - sum(qwz[2])) / 2  # (N - 1) / N at 2 ranks
        check(abs((plain[1] - qwz[1]) - saved) <= 0.02 * saved,
              "the step's bytes sent fall by the gathers' difference: %d -> %d (%.0f saved, the "
              "gathers' %.0f)" % (plain[1], qwz[1], plain[1] - qwz[1], saved))
        check("bit-identical" in qwz[3], "qwZ: every rank's weights the same bits")
        base = ["train", "--data", os.path.join(tmp, "train.txt"), "--n-layer", "2", "--n-head",
                "4", "--n-embd", "64", "--steps", "1"]
        expect_refused(dtrain, base, [
            (["--zero-stage", "2", "--zero-quantized-weights"], "applies to --zero-stage 3"),
            (["--zero-stage", "3", "--zero-quantized-weights", "--dtype", "bf16"],
             "fp32 gathers only"),
            (["--zero-stage", "3", "--zero-quant-block", "64"], "add --zero-quantized-weights"),
        ])
    finish()


if __name__ == "__main__":
    main()
