"""`dtrain train --profile`: the table's counts, checked against the model's
sizes.

  test_profile.py DTRAIN

GPT-2's shapes (vocabulary 50257, C 768, 12 heads) with 1 layer, batch
2 x 64 (uneven against every block size), 3 steps. The FLOPs of the
matrix products a step must be 6 x tokens x the weights the products use
(each layer's 12 C^2, the tied head's V C): the forward's 2 per weight
and token, and the backward's 4, the standard count, derived here from
the sizes alone. Attention's are the causal count (half the T x T scores:
2 B T^2 C forward, 5 B T^2 C backward, a layer). The bias gradients read
each biased linear's output gradient once. No part's time may exceed
the step's: what the kernels claim, with the data and the communication,
leaves a rest of at least 0 (a kernel counted twice would not). Timing
itself is not checked. Each step's --log-json entry carries its parts,
which add up to its time. The products by shape are the architecture's
(each linear's forward, input gradient and weight gradient, the tied
head's), once a step each, and add up to the matrix products' row. Ring
attention (--cp 2) counts as attention too: rank 0's share is half the
causal count. And --profile with one step says there is nothing to
profile.
"""
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import run  # noqa: E402

L, C, V, B, T = 1, 768, 50257, 2, 64


def parts(out):
    rows = {}
    for m in re.finditer(r"^  (\S.*?)\s{2,}(-?[\d.]+)\s+(-?[\d.]+)%(?:\s+([\d.]+)\s+([\d.]+))?",
                         out, re.M):
        rows[m.group(1)] = [float(x) if x else None for x in m.groups()[1:]]
    return rows


def expected_products():
    """Each product a step, from the architecture alone, as (the output's
    two sides sorted, the inner size): a dt_matmul may form C or its
    transpose. Per linear layer (in, out): forward (BT x out, inner in),
    the input's gradient (BT x in, inner out), the weight's (in x out,
    inner BT); the layer's four linears (C->3C, C->C, C->4C, 4C->C) and the
    tied head (C->V)."""
    rows = B * T
    linears = L * [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)] + [(C, V)]
    want = collections.Counter()
    for i, o in linears:
        for a, b, k in ((rows, o, i), (rows, i, o), (i, o, rows)):
            want[(min(a, b), max(a, b), k)] += 1
    return want


def shapes_check(out, parts_rows):
    """The products by shape: the architecture's products, each once a
    step, and together the matrix products' row (time and FLOPs)."""
    got, ms, gflop = collections.Counter(), 0.0, 0.0
    table = out.split("matrix products by shape")[1] if "matrix products by shape" in out else ""
    for m in re.finditer(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+(A\^?T? B\^?T?)\s+(\S.*?)\s+([\d.]+)"
                         r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$", table, re.M):
        M, N, K = (int(x) for x in m.group(1, 2, 3))
        got[(min(M, N), max(M, N), K)] += round(float(m.group(6)))
        ms += float(m.group(7))
        gflop += float(m.group(8))
    want = expected_products()
    check(got == want, "the products by shape: the architecture's %d products a step "
          "(missing %s, extra %s)" % (sum(want.values()), dict(want - got), dict(got - want)))
    mm = parts_rows.get("matrix products", [None] * 4)
    check(mm[0] is not None and abs(ms - mm[0]) <= 0.01 * len(got) + 1e-3 * mm[0] and
          abs(gflop - mm[2]) <= 0.001 * len(got) + 1e-4 * mm[2],
          "the products by shape add up to the matrix products' row: %.2f ms (row %s), %.3f "
          "GFLOP (row %s)" % (ms, mm[0], gflop, mm[2]))


def ring_check(dtrain):
    """Ring attention (--cp 2) counts its blocks as attention: zig-zag
    shards give each rank half of every sequence's causal pairs, so rank
    0's attention FLOPs are half the one-process count (the benchmark
    model's C 384 at T 256, where the table's two decimals hold it to 3%
    and the run is short), and its new parts leave a rest of at least 0
    (none counted twice)."""
    t, c = 256, 384
    r = run(dtrain, ["train", "--model", "bench", "--n-layer", "1", "--batch-size", str(B),
                     "--seq-len", str(t), "--threads", "1", "--eval-batches", "0", "--nproc",
                     "2", "--cp", "2", "--steps", "3", "--profile"])
    att = 7 * B * t * t * c / 2 / 1e9
    p = parts(r.stdout)
    got = p.get("attention", [None] * 4)[2]
    check(r.returncode == 0 and got is not None and abs(got - att) <= 0.005 + 1e-4 * att,
          "ring attention (--cp 2): rank 0's attention %s GFLOP a step, half the causal "
          "count %.3f (exit %d)" % (got, att, r.returncode))
    rest = p.get("the rest", [None])[0]
    check(rest is not None and rest >= 0, "ring attention (--cp 2): the rest %s ms, not below 0"
          % rest)


def main():
    dtrain = sys.argv[1]
    base = ["train", "--model", "gpt2", "--n-layer", str(L), "--batch-size", str(B),
            "--seq-len", str(T), "--threads", "1", "--eval-batches", "0"]
    log = os.path.join(os.environ.get("TMPDIR", "/tmp"), "dtrain-profile-%d.json" % os.getpid())
    r = run(dtrain, base + ["--steps", "3", "--profile", "--log-json", log])
    out = r.stdout
    steps = [json.loads(l) for l in open(log)] if os.path.exists(log) else []
    if os.path.exists(log):
        os.unlink(log)
    per_step = [e.get("profile_ms", {}) for e in steps]
    check(len(steps) == 3 and all(
        abs(sum(v for k, v in p.items() if k != "comm_hidden") - e["ms"]) < 1e-3 * e["ms"] and
        p.get("matmul", 0) > 0 and p.get("rest", -1) >= 0 for p, e in zip(per_step, steps)),
        "--log-json: each step's profile_ms parts (%s) add up to its ms"
        % sorted(per_step[0]) if per_step else "no log")
    check(r.returncode == 0 and "profile of rank 0, per step" in out,
          "--profile prints its table (exit %d)" % r.returncode)
    p = parts(out)
    step = float(re.search(r"the mean of 2 steps after the first: ([\d.]+) ms", out).group(1))
    mm = 6 * B * T * (L * 12 * C * C + V * C) / 1e9
    got = p.get("matrix products", [None] * 4)[2]
    check(got is not None and abs(got - mm) <= 0.005 + 1e-4 * mm,
          "matrix products: %s GFLOP a step, 6 x tokens x weights = %.2f" % (got, mm))
    att = 7 * B * T * T * C * L / 1e9
    got = p.get("attention", [None] * 4)[2]
    check(got is not None and abs(got - att) <= 0.005 + 1e-4 * att,
          "attention: %s GFLOP a step, the causal count %.3f" % (got, att))
    for name in ("layer norms", "activations", "cross-entropy", "embeddings", "optimizer",
                 "gradient norm", "bias gradients", "data", "communication waited on",
                 "the rest", "communication hidden"):
        check(name in p, "the table has a row for %s" % name)
    # Each linear's bias gradient reads its output's gradient once: 9 C
    # columns a layer (c_attn 3C, attn.c_proj C, c_fc 4C, mlp.c_proj C),
    # 4 bytes each a token, and reads and writes the bias.
    gb = L * 9 * C * (4 * B * T + 8) / 1e9
    got = p.get("bias gradients", [None] * 4)[3]
    check(got is not None and abs(got - gb) <= 0.0005,
          "bias gradients: %s GB a step, 9 C columns x tokens x 4 bytes = %.4f" % (got, gb))
    shapes_check(out, p)
    rest = p.get("the rest", [None])[0]
    total = sum(v[0] for k, v in p.items() if k not in ("the rest", "communication hidden"))
    check(rest is not None and rest >= 0 and abs(total + rest - step) < 0.05,
          "the parts (%.2f ms) and the rest (%s ms) make the step (%.2f ms), the rest not below "
          "0" % (total, rest, step))
    ring_check(dtrain)
    r = run(dtrain, base + ["--steps", "1", "--profile"])
    check(r.returncode == 0 and "no step after the first" in r.stdout,
          "--profile with one step: nothing to profile, said so")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
