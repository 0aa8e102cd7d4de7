"""The Llama family (--arch llama) under every layout that splits a layer
or a sequence or the stages, against one process on the same global batch.

  test_llama_layouts.py DTRAIN

- Llama 3's vocabulary (128256) and head layout (64-wide heads, 4 query
  heads per key/value head), 2 layers of 512, SwiGLU 1792 wide, untied
  head: tp 2 with sequence parallelism, each rank holding half the query
  heads with their key/value head and half of each vocabulary table.
- A small model (6 heads, 2 key/value heads, 48 wide, untied head):
  context parallelism 2 by ring attention (zig-zag chunks: each rank turns
  its rows by their positions in the whole sequence) and by Ulysses;
  pipelines of 2 stages under 1f1b and zb1p (the untied head on the last
  stage, the embedding on the first only), 4 layers; tp 2 x pp 2 with a
  tied head; and the 8-rank mesh tp 2 x cp 2 x pp 2 (ring attention).
- Mixtral's sparse MLP (4 SwiGLU experts, top 2): expert parallelism
  ep 2 gives one process's bits (--grad-accum 2), and tp 2 is within 1e-5.
All with SGD (AdamW's first steps turn the row-parallel sums' rounding
into whole steps): losses within 1e-6 of one process, final weights
within 1e-5; zb1p gives 1f1b's bits.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import rel_err, same_bits, train_logged, write_words  # noqa: E402

SGD = ["--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.01", "--lr-schedule", "constant"]
COMMON = ["--arch", "llama", "--shuffle", "0", "--threads", "1", "--eval-batches", "0",
          "--print-every", "100", "--steps", "3"] + SGD
REAL = ["--n-layer", "2", "--n-head", "8", "--n-kv-head", "2", "--n-embd", "512",
        "--ffn-hidden-size", "1792", "--vocab-size", "128256", "--batch-size", "1",
        "--seq-len", "64"]
SMALL = ["--n-layer", "4", "--n-head", "6", "--n-kv-head", "2", "--n-embd", "48",
         "--ffn-hidden-size", "40", "--batch-size", "2", "--seq-len", "32"]


def train(dtrain, tmp, name, ranks, args):
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".st")
    a = ["train", "--data", os.path.join(tmp, "words.txt"), "--log-json", log,
         "--save-final", final] + COMMON + args
    if ranks > 1:
        a = ["launch", "-n", str(ranks), dtrain] + a
    entries, weights, _ = train_logged(dtrain, a, log, final)
    return [e["loss"] for e in entries], weights


def close(got, ref, what):
    worst = max(abs(a - b) / b for a, b in zip(got[0], ref[0]))
    err, where = rel_err(got[1], ref[1], 0.01, 3)
    check(len(got[0]) == len(ref[0]) and worst <= 1e-6 and err <= 1e-5,
          "%s: losses within 1e-6 of one process (%.1e), weights within 1e-5 (%.1e, %s)"
          % (what, worst, err, where))


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        write_words(os.path.join(tmp, "words.txt"), 4)
        one = train(dtrain, tmp, "real_one", 1, REAL)
        close(train(dtrain, tmp, "real_tp2", 2, REAL + ["--tp", "2", "--sequence-parallel"]),
              one, "Llama 3 vocabulary and heads, tp 2 with sequence parallelism")
        one = train(dtrain, tmp, "one", 1, SMALL)
        for algo in ("ring", "ulysses"):
            close(train(dtrain, tmp, "cp_" + algo, 2, SMALL + ["--cp", "2", "--cp-algo", algo]),
                  one, "cp 2 (%s)" % algo)
        acc = ["--grad-accum", "2"]
        one2 = train(dtrain, tmp, "one_acc", 1, SMALL + acc)
        f1b = train(dtrain, tmp, "pp_1f1b", 2, SMALL + acc + ["--pp", "2"])
        close(f1b, one2, "pp 2, 1f1b, untied head on the last stage")
        zb = train(dtrain, tmp, "pp_zb1p", 2, SMALL + acc + ["--pp", "2", "--pp-schedule", "zb1p"])
        check(zb[0] == f1b[0] and same_bits(zb[1], f1b[1]), "pp 2, zb1p: 1f1b's bits (the "
              "untied head's weight half lands in its segment)")
        tied = ["--tie-word-embeddings"]
        close(train(dtrain, tmp, "tp_pp", 4, SMALL + acc + tied + ["--tp", "2", "--pp", "2"]),
              train(dtrain, tmp, "one_tied", 1, SMALL + acc + tied),
              "tp 2 x pp 2, tied head")
        close(train(dtrain, tmp, "mesh8", 8, SMALL + acc + ["--tp", "2", "--cp", "2", "--pp", "2"]),
              one2, "the mesh tp 2 x cp 2 x pp 2 (8 ranks)")
        moe = SMALL + ["--num-experts", "4", "--moe-ffn-hidden-size", "40"]
        one_moe = train(dtrain, tmp, "moe_one", 1, moe + acc)
        ep = train(dtrain, tmp, "moe_ep2", 2, moe + ["--ep", "2"])
        check(ep[0] == one_moe[0] and same_bits(ep[1], one_moe[1]),
              "Mixtral's experts, ep 2: one process's bits")
        close(train(dtrain, tmp, "moe_tp2", 2, moe + ["--tp", "2"]),
              train(dtrain, tmp, "moe_one1", 1, moe), "Mixtral's experts, tp 2")
    finish()


if __name__ == "__main__":
    main()
