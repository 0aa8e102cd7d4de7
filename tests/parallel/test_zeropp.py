"""ZeRO++ against plain stage 3: qwZ (--zero-quantized-weights) gathers the
parameters as int8 blocks with one fp32 scale each; hpZ
(--zero-hpz-partition-size) keeps a second copy of them sharded inside each
host, which backward gathers from; qgZ (--zero-quantized-gradients)
reduce-scatters the gradients as int8 or int4 blocks through all-to-alls,
inside each host, then across hosts.

  test_zeropp.py DTRAIN

On an order-2 Markov corpus of known entropy rate (tests/pylib/markov.py),
2 ranks, 800 steps: plain stage 3 and qwZ both within 0.1 nats of the
entropy rate (both learned), qwZ's validation loss within 5% of plain's
(where the loss leaves its plateau moves by a few percent with the seed),
qgZ int4, and qwZ with qgZ int8 (one run for both of int8's quantizers),
within 2%; and after 100 steps qwZ with --dtype bf16 (int8 from the fp32
masters into the bf16 window) within 2% of bf16 stage 3's. Traffic: each
parameter gather of step 1 (the --trace timeline's allgather events) moves
(1 + 4 / 256) / 4 of fp32's bytes, and the step's bytes sent fall by
(N - 1) / N of the gathers' difference; each gradient all-to-all of qgZ
(bits / 8 + 4 / 256) / 4 of the fp32 reduce-scatter's bytes. Every rank's
weights the same bits (each dequantizes the same bytes). Bad input: qwZ
and qgZ below stage 3, --zero-quant-block without either,
qgZ at 6 bits.

hpZ, 4 ranks on 2 fake hosts (DTRAIN_HOSTNAME), groups of 2, 6 steps: the
losses and weights plain stage 3's bits (backward gathers the values
forward gathered), with qwZ qwZ's bits; from the links' counters
(DTRAIN_ZERO_EVENTS), hpZ's gathers send 0 bytes off the host, and the
data-parallel group sends less by exactly the backward gathers' bytes:
(N - 1) / N of each segment there against (K - 1) / K in the host, 1.5x
hpZ's bytes at N = 4, K = 2. A group size that does not divide the ranks is
refused. qgZ on the same hosts: its links' counters against its formula
(qgz_hosts), and its losses within 1% of plain stage 3's.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import expect_refused, same_bits, train_small, write_words  # noqa: E402
from markov import K, make_chain, entropy_rate, sample  # noqa: E402

STEPS = 800
BF16_STEPS = 100  # qwZ in bf16 against bf16 stage 3: 0.2% apart at 100 steps


def train(dtrain, tmp, name, extra, seed=1, steps=STEPS):
    log, trace = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".trace.json")
    r = subprocess.run([dtrain, "train", "--data", os.path.join(tmp, "train.txt"), "--val-data",
                        os.path.join(tmp, "val.txt"), "--n-layer", "2", "--n-head", "4",
                        "--n-embd", "64", "--block-size", "64", "--batch-size", "16", "--steps",
                        str(steps), "--lr", "3e-3", "--warmup-steps", "50", "--lr-schedule",
                        "cosine", "--eval-batches", "16", "--seed", str(seed), "--threads", "1",
                        "--nproc", "2", "--zero-stage", "3", "--log-json", log, "--trace",
                        trace, "--print-every", "100"] + extra,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:])
        raise SystemExit("dtrain failed: %s" % name)
    lines = [json.loads(l) for l in open(log)]
    val = [e["val_loss"] for e in lines if "val_loss" in e][-1]
    sent = [e["bytes_sent"] for e in lines if "bytes_sent" in e]
    return val, sent[1], step1_bytes(trace, "allgather"), r.stdout, trace


def step1_bytes(trace, name):
    """The bytes of each `name` event of step 1 on rank 0 (--trace)."""
    ev = json.load(open(trace))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    return [e["args"]["bytes"] for e in ev if e.get("name") == name and e.get("pid") == 0 and
            e["args"].get("step") == 1]


def traffic(path, steps):
    """Per step: the data-parallel group's bytes and those off the host,
    hpZ's, then qgZ's two groups' (rank 0's DTRAIN_ZERO_EVENTS)."""
    rows = [l.split() for l in open(path + ".0") if l.split()[1:2] == ["traffic"]]
    return [tuple(int(x) for x in (r[2], r[3], r[5], r[6], r[8], r[9])) for r in rows][:steps]


def qgz_hosts(runs, trace):
    """qgZ over 2 fake hosts of 2 ranks (K = 2, H = 2): per segment a rank
    sends (K - 1) H packets inside its host and H - 1 across, so the links
    count 3x as many bytes in all as off the host, and the bytes off the
    host are one packet per segment: the step's first all-to-alls (each N
    packets) over N. Six losses within 1% of plain stage 3's."""
    p, q = runs["plain"], runs["qgz"]
    check("then 2 hosts (tcp)" in q[2] and "over 2 ranks (shm)" in q[2],
          "the banner names qgZ's two hops: in the host (shm), then across hosts (tcp)")
    steps = [(t[4], t[5]) for t in q[5]]
    check(len(steps) == 6 and all(off > 0 and total == 3 * off for total, off in steps),
          "qgZ's groups sent 3x as many bytes as they sent off the host, every step: %s" %
          steps[:2])
    hop1 = step1_bytes(trace, "alltoall_qgz")
    check(len(hop1) > 0 and steps[0][1] == sum(hop1) // 4,
          "step 1's bytes off the host, %d, one packet a segment: the %d all-to-alls' %d "
          "bytes over 4 ranks" % (steps[0][1], len(hop1), sum(hop1)))
    worst = max(abs(a - b) / b for a, b in zip(q[0], p[0]))
    check(len(q[0]) == 6 and worst <= 0.01,
          "qgZ at 4 ranks on 2 hosts: 6 losses within 1%% of plain stage 3's (worst %.2e)" % worst)


def hpz(dtrain, tmp):
    write_words(os.path.join(tmp, "data.txt"), 5)
    model = ["--n-layer", "2", "--n-head", "4", "--n-embd", "48", "--block-size", "16"]
    base = ["--nproc", "4", "--zero-stage", "3", "--batch-size", "2"]
    env = dict(os.environ)
    runs = {}
    try:
        os.environ["DTRAIN_HOSTNAME"] = "hostA,hostA,hostB,hostB"
        for name, extra in (("plain", []), ("hpz", ["--zero-hpz-partition-size", "2"]),
                            ("qwz", ["--zero-quantized-weights"]),
                            ("both", ["--zero-quantized-weights", "--zero-hpz-partition-size",
                                      "2"]),
                            ("qgz", ["--zero-quantized-gradients", "--trace",
                                     os.path.join(tmp, "qgz.trace.json")])):
            os.environ["DTRAIN_ZERO_EVENTS"] = os.path.join(tmp, name + ".ev")
            got = train_small(dtrain, tmp, name, model, base + extra, 6, 3e-3)
            runs[name] = got + (traffic(os.path.join(tmp, name + ".ev"), 6),)
    finally:
        os.environ.clear()
        os.environ.update(env)
    p, h = runs["plain"], runs["hpz"]
    check(h[0] == p[0] and same_bits(h[1], p[1]),
          "hpZ: 6 steps at 4 ranks, the losses and weights plain stage 3's bits")
    check(runs["both"][0] == runs["qwz"][0] and same_bits(runs["both"][1], runs["qwz"][1]),
          "hpZ with qwZ: qwZ's bits (backward uses forward's dequantized values)")
    check("hpZ: backward gathers over 2 ranks (shm)" in h[2] and "bit-identical" in h[2],
          "the banner names hpZ's groups and their transport; replicas identical")
    off = [t[3] for t in h[5]]
    check(len(off) == 6 and all(t[2] > 0 for t in h[5]) and off == [0] * 6,
          "hpZ's gathers sent %s bytes a step, %s of them off the host" %
          ([t[2] for t in h[5]], off))
    ok = all(pt[0] - ht[0] == ht[2] * 3 // 2 and ht[2] % 2 == 0
             for pt, ht in zip(p[5], h[5]))
    check(len(p[5]) == 6 and ok and all(ht[1] < pt[1] for pt, ht in zip(p[5], h[5])),
          "the data-parallel group sends 1.5x hpZ's bytes less a step (%s -> %s, hpZ %s), "
          "and less off the host (%s -> %s)" % (p[5][0][0], h[5][0][0], h[5][0][2],
                                                p[5][0][1], h[5][0][1]))
    qgz_hosts(runs, os.path.join(tmp, "qgz.trace.json"))
    expect_refused(dtrain, ["train", "--data", os.path.join(tmp, "data.txt")] + model + [
        "--steps", "1", "--nproc", "4", "--zero-stage", "3"],
        [(["--zero-hpz-partition-size", "3"], "use a divisor of 4")])


def main():
    dtrain = sys.argv[1]
    rng = np.random.default_rng(2024)
    P = make_chain(rng)
    H = entropy_rate(P)
    with tempfile.TemporaryDirectory() as tmp:
        hpz(dtrain, tmp)
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "train.txt"), "wb").write(sample(P, 200000, rng))
        open(os.path.join(tmp, "val.txt"), "wb").write(sample(P, 40000, rng))
        plain = train(dtrain, tmp, "plain", [])
        qwz = train(dtrain, tmp, "qwz", ["--zero-quantized-weights"])
        qgz4 = train(dtrain, tmp, "qgz4", ["--zero-quantized-gradients", "--zero-qgz-bits", "4"])
        both = train(dtrain, tmp, "both", ["--zero-quantized-weights",
                                           "--zero-quantized-gradients"])
        plain16 = train(dtrain, tmp, "plain16", ["--dtype", "bf16"], steps=BF16_STEPS)
        qwz16 = train(dtrain, tmp, "qwz16", ["--zero-quantized-weights", "--dtype", "bf16"],
                      steps=BF16_STEPS)

        check(plain[0] < H + 0.1 and qwz[0] < H + 0.1,
              "both learn, to within 0.1 nats of the entropy rate: validation losses %.4f (plain), %.4f (qwZ); unigram entropy %.4f, "
              "entropy rate %.4f" % (plain[0], qwz[0], np.log(K), H))
        # qwZ alone moves where the loss leaves its plateau by more than the
        # others: one seed's pair of runs has differed by 3.3% (plain 1.0854,
        # qwZ 1.1214) and another's by 2.4% the other way (1.1229, 1.0956),
        # so qwZ's run is held to 5% of plain's (a second seed's pair, to
        # hold their mean to 2%, cost 50 s of CI time); that both learn to
        # within 0.1 nats of H is the check a broken quantizer fails.
        check(abs(qwz[0] - plain[0]) <= 0.05 * plain[0],
              "qwZ's validation loss %.4f within 5%% of plain stage 3's %.4f (%.1f%%)"
              % (qwz[0], plain[0], 100 * abs(qwz[0] - plain[0]) / plain[0]))
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
        for name, run, ref in (("qgZ int4", qgz4, plain), ("qwZ with qgZ int8", both, plain),
                               ("qwZ with --dtype bf16, %d steps" % BF16_STEPS, qwz16, plain16)):
            check(abs(run[0] - ref[0]) <= 0.02 * ref[0],
                  "%s: validation loss %.4f within 2%% of plain stage 3's %.4f%s" %
                  (name, run[0], ref[0], " (bf16)" if ref is plain16 else ""))
        rs = step1_bytes(plain[4], "reduce_scatter")
        for name, run, bits in (("int8 (with qwZ)", both, 8), ("int4", qgz4, 4)):
            want = (bits / 8 + 4 / 256) / 4  # the values, and a scale for 256 of them
            ratios = [q / p for q, p in zip(step1_bytes(run[4], "alltoall_qgz"), rs)]
            check(len(ratios) == len(rs) > 0 and all(abs(r - want) <= 0.002 for r in ratios),
                  "qgZ %s: each of step 1's %d gradient all-to-alls moves %.4f of the fp32 "
                  "reduce-scatter's bytes (%s)" % (name, len(rs), want,
                                                   sorted(set(round(r, 4) for r in ratios))))
        check("bit-identical" in both[3], "qwZ with qgZ: every rank's weights the same bits")
        check("bit-identical" in qwz16[3], "qwZ with bf16: every rank's weights the same bits")
        base = ["train", "--data", os.path.join(tmp, "train.txt"), "--n-layer", "2", "--n-head",
                "4", "--n-embd", "64", "--steps", "1"]
        expect_refused(dtrain, base, [
            (["--zero-stage", "2", "--zero-quantized-weights"], "applies to --zero-stage 3"),
            (["--zero-stage", "2", "--zero-quantized-gradients"], "applies to --zero-stage 3"),
            (["--zero-stage", "3", "--zero-quantized-gradients", "--zero-qgz-bits", "6"],
             "use 8 or 4"),
            (["--zero-stage", "3", "--zero-quant-block", "64"], "add --zero-quantized-weights"),
        ])
    finish()


if __name__ == "__main__":
    main()
