"""Pipeline parallelism against one process on the same global batch.

  test_pipeline.py DTRAIN [--quick]

(--quick: pp 2 only, for the sanitizer builds.)

Equivalence (5 steps, AdamW with weight decay, clipping at 1, --shuffle 0,
4 layers): naive, gpipe and 1f1b at pp 2, 3 and 4, interleaved at pp 2 with
2 chunks per rank, and 1f1b at pp 2 x dp 2, each with M = 1, 3 and 8
micro-batches (interleaved: 8; it refuses M not a multiple of pp). Every
logged loss within 1e-6 relative, the weights within 1e-5 (the worst
tensor's ||a - b|| / ||b||). Not bit-identical: the tied embedding's
gradient is the embeddings' share (first stage) plus the head's (last
stage) summed once per step, where one process adds them micro-batch by
micro-batch; every other gradient adds in the same order (GPipe's
backwards run in micro-batch order for that reason). The run's replica
check (the tied embedding's two copies, a stage's data-parallel copies)
must pass.
Evaluation runs through the stages: the final validation loss equals one
process's (over the same sequences: with dp 2 the micro-batch is halved and
the batches doubled).
--pp-partition cost (pp 2, and pp 2 x dp 2 unless --quick; M = 3; a
vocabulary of 4096, whose head costs several layers): equal to one
process as above (pp 2 x dp 2: to DDP over 2 ranks, whose split sums
alone move the weights 2e-5 from one process's at this vocabulary), and the line it prints holds the measured costs
and a cut that is valid (every stage non-empty, consecutive, all 4
layers), the one the batch line reports, and the best for those costs (its
heaviest stage the least of every cut's, enumerated here, to the printed
precision).
Timeline (--trace of a pp 2 run): compute events of a rank never overlap,
every receive ends after its matching send starts, one forward and one
backward per micro-batch.
Bad input: --pp not dividing the ranks, more stages than layers,
interleaved with M not a multiple of pp, pipeline options without --pp,
ZeRO or checkpoints with --pp.
"""
import itertools
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import expect_refused, rel_err, train_logged, write_words  # noqa: E402

STEPS, LR = 5, 3e-3


def train(dtrain, tmp, name, extra):
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".safetensors")
    args = ["train", "--data", os.path.join(tmp, "data.txt"), "--n-layer", "4", "--n-head", "2",
            "--n-embd", "32", "--block-size", "32", "--steps", str(STEPS),
            "--lr-schedule", "constant", "--weight-decay", "0.1", "--grad-clip", "1",
            "--shuffle", "0", "--threads", "1", "--log-json", log, "--save-final", final,
            "--lr", str(LR), "--print-every", "100", "--eval-batches", "2"] + extra
    entries, weights, out = train_logged(dtrain, args, log, final)
    val = re.findall(r"val loss ([0-9.]+)", out)
    return [e["loss"] for e in entries], weights, out, val[-1] if val else None


def equivalence(dtrain, tmp, quick):
    layouts = [(2, 2, k, []) for k in ("naive", "gpipe", "1f1b")]
    layouts += [(2, 2, "interleaved", ["--pp-virtual", "2"])]
    if not quick:
        layouts += [(n, n, k, []) for n in (3, 4) for k in ("naive", "gpipe", "1f1b")]
        layouts += [(4, 2, "1f1b", [])]  # pp 2 x dp 2
    for M in (1, 3, 8):
        ref = train(dtrain, tmp, "one%d" % M, ["--batch-size", "2", "--grad-accum", str(M)])
        if ref is None:
            continue
        for n, pp, kind, extra in layouts:
            if kind == "interleaved" and M % pp:
                continue
            dp = n // pp
            name = "pp%d_%s_n%d_M%d" % (pp, kind, n, M)
            got = train(dtrain, tmp, name,
                        ["--nproc", str(n), "--pp", str(pp), "--pp-schedule", kind,
                         "--batch-size", str(2 // dp), "--grad-accum", str(M),
                         "--eval-batches", str(2 * dp)] + extra)
            if got is None:
                continue
            worst = max(abs(a - b) / abs(b) for a, b in zip(got[0], ref[0]))
            check(len(got[0]) == STEPS and worst <= 1e-6,
                  "%s: %d losses within 1e-6 of one process's (worst %.2e)"
                  % (name, len(got[0]), worst))
            err, where = rel_err(got[1], ref[1], LR, STEPS)
            check(err <= 1e-5, "%s: weights within 1e-5 (worst %.2e, %s)" % (name, err, where))
            check("replicas: every copy of a part of the model" in got[2],
                  "%s: the tied embedding's copies (and dp replicas) agree" % name)
            check(got[3] is not None and got[3] == ref[3],
                  "%s: validation loss through the stages %s, one process %s"
                  % (name, got[3], ref[3]))


COST_LINE = re.compile(r"pipeline partition cost: embed (\S+) ms, layer (\S+) ms, head (\S+) ms"
                       r".*-> stages((?: \[\d+,\d+\))+)$", re.M)


def heaviest(stages, embed, layer, head):
    return max((embed if k == 0 else 0) + (head if k == len(stages) - 1 else 0) + layer * (b - a)
               for k, (a, b) in enumerate(stages))


def check_cost_cut(name, out, pp, L=4):
    """The printed costs and cut: valid, reported alike on the batch line,
    and the best for the printed costs (every cut enumerated)."""
    m = COST_LINE.search(out)
    check(m is not None, "%s: prints the measured costs and the cut" % name)
    if m is None:
        return
    embed, layer, head = (float(x) for x in m.groups()[:3])
    stages = [(int(a), int(b)) for a, b in re.findall(r"\[(\d+),(\d+)\)", m.group(4))]
    check(min(embed, layer, head) >= 0 and layer > 0,
          "%s: costs embed %g, layer %g, head %g ms" % (name, embed, layer, head))
    check(len(stages) == pp and stages[0][0] == 0 and stages[-1][1] == L and
          all(a < b for a, b in stages) and all(x[1] == y[0] for x, y in zip(stages, stages[1:])),
          "%s: stages %s are %d consecutive non-empty ones over %d layers"
          % (name, stages, pp, L))
    layers = " | ".join("%d-%d" % (a, b - 1) for a, b in stages)
    check("layers %s)" % layers in out, "%s: the batch line runs the same stages (%s)"
          % (name, layers))
    cuts = itertools.combinations(range(1, L), pp - 1)
    least = min(heaviest(list(zip((0,) + c, c + (L,))), embed, layer, head) for c in cuts)
    got = heaviest(stages, embed, layer, head)
    check(got <= least * (1 + 1e-3), "%s: heaviest stage %g ms, the best cut's %g ms"
          % (name, got, least))


def cost_partition(dtrain, tmp, quick):
    """--pp-partition cost at M = 3 against one process (pp 2) and DDP over
    2 ranks (pp 2 x dp 2: at this vocabulary DDP's split sums alone move
    the weights 2e-5 from one process's, the pipeline adds nothing to it).
    A vocabulary of 4096 makes the head cost several layers, so the best
    cut is not the uniform one: a partition that ignored the costs fails
    the last check."""
    vocab = ["--vocab-size", "4096", "--grad-accum", "3"]
    refs = {2: train(dtrain, tmp, "one_v4096", ["--batch-size", "2"] + vocab)}
    if not quick:
        refs[4] = train(dtrain, tmp, "ddp_v4096", ["--nproc", "2", "--batch-size", "1",
                                                   "--eval-batches", "4"] + vocab)
    for n, ref in sorted(refs.items()):
        dp = n // 2
        name = "pp2_cost_n%d_M3" % n
        got = train(dtrain, tmp, name, ["--nproc", str(n), "--pp", "2", "--pp-partition", "cost",
                                        "--batch-size", str(2 // dp),
                                        "--eval-batches", str(2 * dp)] + vocab)
        worst = max(abs(a - b) / abs(b) for a, b in zip(got[0], ref[0]))
        check(len(got[0]) == STEPS and worst <= 1e-6,
              "%s: %d losses within 1e-6 of %s (worst %.2e)"
              % (name, len(got[0]), "DDP's" if dp > 1 else "one process's", worst))
        err, where = rel_err(got[1], ref[1], LR, STEPS)
        check(err <= 1e-5, "%s: weights within 1e-5 (worst %.2e, %s)" % (name, err, where))
        check("replicas: every copy of a part of the model" in got[2],
              "%s: the tied embedding's copies (and dp replicas) agree" % name)
        check(got[3] is not None and got[3] == ref[3],
              "%s: validation loss through the stages %s, reference %s"
              % (name, got[3], ref[3]))
        check_cost_cut(name, got[2], 2)


def timeline(dtrain, tmp):
    """A pp 2 run's --trace: per rank, compute events never overlap; every
    receive ends after its matching send (same stage edge and micro-batch)
    starts; each rank computes one forward and one backward per
    micro-batch and step."""
    trace = os.path.join(tmp, "pp.trace.json")
    got = train(dtrain, tmp, "traced", ["--nproc", "2", "--pp", "2", "--batch-size", "2",
                                        "--grad-accum", "4", "--trace", trace])
    if got is None:
        return
    ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    for pid in (0, 1):
        comp = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev
                      if e["pid"] == pid and e["tid"] == 0)
        check(all(a[1] <= b[0] + 1e-3 for a, b in zip(comp, comp[1:])),
              "trace: rank %d's compute events do not overlap" % pid)
        for name in ("forward", "backward"):
            n = sum(1 for e in ev if e["pid"] == pid and e["name"] == name)
            check(n == 4 * STEPS, "trace: rank %d ran %d %ss (4 x %d steps)"
                  % (pid, n, name, STEPS))
    pairs = [("send_activation", "recv_activation", 1), ("send_grad", "recv_grad", -1)]
    for send_name, recv_name, step in pairs:
        sends = {}
        for e in ev:
            if e["name"] == send_name:
                sends.setdefault((e["args"]["stage"] + step, e["args"]["micro"]), []).append(e)
        recvs = [e for e in ev if e["name"] == recv_name]
        ok = len(recvs) == 4 * STEPS and all(
            any(s["ts"] <= r["ts"] + r["dur"] for s in sends.get((r["args"]["stage"],
                                                                   r["args"]["micro"]), []))
            for r in recvs)
        check(ok, "trace: %d %s events, each ending after its %s starts"
              % (len(recvs), recv_name, send_name))


def bad_input(dtrain, tmp):
    base = ["train", "--data", os.path.join(tmp, "data.txt"), "--n-layer", "4", "--n-head", "2",
            "--n-embd", "32", "--block-size", "32", "--steps", "1", "--threads", "1"]
    expect_refused(dtrain, base, [
        (["--nproc", "3", "--pp", "2"], "does not divide the job's 3 ranks"),
        (["--nproc", "2", "--pp", "2", "--n-layer", "1"], "need at least 2 layers"),
        (["--nproc", "2", "--pp", "2", "--pp-schedule", "interleaved", "--pp-virtual", "2",
          "--grad-accum", "3"], "not a multiple of p = 2"),
        (["--nproc", "2", "--pp", "2", "--pp-virtual", "2"], "applies to --pp-schedule interleaved"),
        (["--pp-schedule", "gpipe"], "add --pp 2 or more"),
        (["--nproc", "2", "--pp", "2", "--zero-stage", "1"], "with --pp is not supported yet"),
        (["--nproc", "2", "--pp", "2", "--out", os.path.join(tmp, "ck")], "not supported yet"),
        (["--nproc", "2", "--pp", "2", "--strategy", "ps"], "cannot hold stages"),
    ])


def main():
    dtrain, quick = sys.argv[1], "--quick" in sys.argv[2:]
    with tempfile.TemporaryDirectory() as tmp:
        write_words(os.path.join(tmp, "data.txt"), 7)
        equivalence(dtrain, tmp, quick)
        cost_partition(dtrain, tmp, quick)
        timeline(dtrain, tmp)
        bad_input(dtrain, tmp)
    finish()


if __name__ == "__main__":
    main()
