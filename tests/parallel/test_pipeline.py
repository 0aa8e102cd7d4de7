"""Pipeline parallelism against one process on the same global batch.

  test_pipeline.py DTRAIN [--quick | --schedules]

(--quick: pp 2 and 8 micro-batches only, for the sanitizer builds;
--schedules: of that, only what runs the schedules' sends beside the
compute, for ThreadSanitizer: the equivalence, zb1p's halves and the
timelines.)

Equivalence (5 steps, AdamW with weight decay, clipping at 1, --shuffle 0,
4 layers): naive, gpipe, 1f1b and zb1p at pp 2, 3 and 4, interleaved at pp
2 with 2 chunks per rank, and 1f1b and zb1p at pp 2 x dp 2, each with M =
1, 3 and 8
micro-batches (interleaved: 8; it refuses M not a multiple of pp). Every
logged loss within 1e-6 relative, the weights within 1e-5 (the worst
tensor's ||a - b|| / ||b||). Not bit-identical: the tied embedding's
gradient is the embeddings' share (first stage) plus the head's (last
stage) summed once per step, where one process adds them micro-batch by
micro-batch; every other gradient adds in the same order (GPipe's
backwards run in micro-batch order for that reason). The run's replica
check (the tied embedding's two copies, a stage's data-parallel copies)
must pass.
zb1p's split backward (input halves, weight halves later) must leave the
bits of 1f1b's whole one: its final weights equal 1f1b's bit for bit, in
fp32 at every layout above, and with bf16 weights, bf16 gradient
accumulation and full recomputation (the weight halves rebuild layers).
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
Activations: each stage's micro-batches in flight and accounted activation
memory, against the schedule's counts and the documented sizes.
Timeline (--trace of a pp 2 run): compute events of a rank never overlap,
every receive ends after its matching send starts, one forward and one
backward per micro-batch.
Checkpoints: sharded by stage, resumed bit for bit at the same layout and
within 1e-5 at others (one process, pp x dp), and the other way round.
Bad input: --pp not dividing the ranks, more stages than layers,
interleaved with M not a multiple of pp, pipeline options without --pp,
ZeRO-2 with --pp (ZeRO-1 within the stages: test_pp_zero.py).
"""
import itertools
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import expect_refused, rel_err, run, same_bits, train_logged, write_words  # noqa: E402

STEPS, LR = 5, 3e-3


def train(dtrain, tmp, name, extra, steps=STEPS):
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".safetensors")
    args = ["train", "--data", os.path.join(tmp, "data.txt"), "--n-layer", "4", "--n-head", "2",
            "--n-embd", "32", "--block-size", "32", "--steps", str(steps),
            "--lr-schedule", "constant", "--weight-decay", "0.1", "--grad-clip", "1",
            "--shuffle", "0", "--threads", "1", "--log-json", log, "--save-final", final,
            "--lr", str(LR), "--print-every", "100", "--eval-batches", "2"] + extra
    entries, weights, out = train_logged(dtrain, args, log, final)
    val = re.findall(r"val loss ([0-9.]+)", out)
    return [e["loss"] for e in entries], weights, out, val[-1] if val else None


def equivalence(dtrain, tmp, quick):
    kinds = ("naive", "gpipe", "1f1b", "zb1p")
    layouts = [(2, 2, k, []) for k in kinds]
    layouts += [(2, 2, "interleaved", ["--pp-virtual", "2"])]
    if not quick:
        layouts += [(n, n, k, []) for n in (3, 4) for k in kinds]
        layouts += [(4, 2, k, []) for k in ("1f1b", "zb1p")]  # pp 2 x dp 2
    weights = {}
    # Quick: 8 micro-batches only, where every schedule keeps the most in
    # flight (and the interleaved one runs).
    for M in (8,) if quick else (1, 3, 8):
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
            weights[name] = got[1]
            twin = name.replace("zb1p", "1f1b")
            if kind == "zb1p" and twin in weights:
                check(same_bits(got[1], weights[twin]),
                      "%s: final weights bit-identical to 1f1b's" % name)


def zb1p_halves(dtrain, tmp):
    """zb1p against 1f1b, bit for bit, where the split backward has the
    most to get right: bf16 weights widened per segment, gradients
    accumulated in bf16 (rounded once per micro-batch), and full
    recomputation (each weight half rebuilds its layers)."""
    extra = ["--nproc", "2", "--pp", "2", "--batch-size", "2", "--grad-accum", "4",
             "--dtype", "bf16", "--grad-accum-dtype", "bf16", "--recompute", "full"]
    a = train(dtrain, tmp, "halves_1f1b", extra + ["--pp-schedule", "1f1b"])
    b = train(dtrain, tmp, "halves_zb1p", extra + ["--pp-schedule", "zb1p"])
    check(a[0] == b[0] and same_bits(a[1], b[1]),
          "zb1p, bf16 + bf16 accumulation + full recompute: losses and final weights "
          "bit-identical to 1f1b's")


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


def timeline(dtrain, tmp, kind, names):
    """A pp 2 run's --trace: per rank, compute events never overlap; every
    receive ends after its matching send (same stage edge and micro-batch)
    starts; each rank computes one of each of `names` per micro-batch and
    step."""
    trace = os.path.join(tmp, "pp_%s.trace.json" % kind)
    got = train(dtrain, tmp, "traced_" + kind,
                ["--nproc", "2", "--pp", "2", "--batch-size", "2", "--grad-accum", "4",
                 "--pp-schedule", kind, "--trace", trace])
    if got is None:
        return
    ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
    for pid in (0, 1):
        comp = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev
                      if e["pid"] == pid and e["tid"] == 0)
        check(all(a[1] <= b[0] + 1e-3 for a, b in zip(comp, comp[1:])),
              "trace %s: rank %d's compute events do not overlap" % (kind, pid))
        for name in names:
            n = sum(1 for e in ev if e["pid"] == pid and e["name"] == name)
            check(n == 4 * STEPS, "trace %s: rank %d ran %d %s events (4 x %d steps)"
                  % (kind, pid, n, name, STEPS))
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
        check(ok, "trace %s: %d %s events, each ending after its %s starts"
              % (kind, len(recvs), recv_name, send_name))


def slot_mib(layers, head, zb, N, C, NH, V):
    """One micro-batch's activations on a stage, by the model's documented
    sizes (fp32, recompute none): its input [N, C]; per layer 16 rows of C
    and the LayerNorms' means and rstds with the attention's lse, (4 + NH)
    N; with the head the final LayerNorm (N C + 2 N), logits N V, losses N;
    the executor's tokens, targets and received output gradient (2 N + N C).
    zb1p's split backward keeps 9 N C more a layer and the input's gradient."""
    f = N * C + layers * (16 * N * C + (4 + NH) * N) + 2 * N + N * C
    if head:
        f += N * C + 2 * N + N * V + N
    if zb:
        f += layers * 9 * N * C + N * C
    return f * 4 / 2**20


def activations(dtrain, tmp):
    """Each stage's activation slots, from the memory table: 1f1b holds
    min(M, p - r) micro-batches on stage r, gpipe all M, zb1p (F to W)
    min(M, p); and the acts each rank accounts equal that many slots plus
    backward's scratch (9 N C, shared), within the table's rounding."""
    Bq, T, C, NH, V, M = 4, 64, 64, 2, 256, 4
    N = Bq * T
    for pp, kind in ((2, "gpipe"), (2, "1f1b"), (2, "zb1p"), (3, "gpipe"), (3, "1f1b")):
        r = run(dtrain, ["train", "--data", os.path.join(tmp, "data.txt"), "--n-layer", "4",
                         "--n-head", str(NH), "--n-embd", str(C), "--block-size", str(T),
                         "--batch-size", str(Bq), "--grad-accum", str(M), "--steps", "1",
                         "--threads", "1", "--nproc", str(pp), "--pp", str(pp),
                         "--pp-schedule", kind, "--eval-batches", "1"])
        cut = re.search(r"micro-batches, layers ([0-9 |-]+)\)", r.stdout)
        peak = r.stdout.split("peak memory per rank")[-1]
        rows = re.findall(r"rank (\d+) \(stage \d+, (\d+) in flight\):.*?acts ([0-9.]+) MiB",
                          peak)
        if r.returncode != 0 or not cut or len(rows) != pp:
            check(False, "pp %d %s: a memory table per stage (exit %d)\n%s"
                  % (pp, kind, r.returncode, r.stdout[-1500:] + r.stderr[-1500:]))
            continue
        spans = [tuple(int(x) for x in c.split("-")) for c in cut.group(1).split(" | ")]
        for rank, flight, acts in rows:
            q, flight, acts = int(rank), int(flight), float(acts)
            want = {"gpipe": M, "1f1b": min(M, pp - q), "zb1p": min(M, pp)}[kind]
            lo, hi = spans[q]
            mib = want * slot_mib(hi - lo + 1, q == pp - 1, kind == "zb1p", N, C, NH, V) \
                + 9 * N * C * 4 / 2**20
            check(flight == want and abs(acts - mib) <= 0.051,
                  "pp %d %s, stage %d: %d micro-batches in flight (want %d), acts %.1f MiB "
                  "(want %.2f)" % (pp, kind, q, flight, want, acts, mib))


def checkpoints(dtrain, tmp):
    """A pipeline run's checkpoint: one shard per stage (dp index 0 of each
    stage writes), the tied embedding once. Resuming it at the same layout
    continues bit for bit; resuming it in one process, or as pp 2 x dp 2
    with zb1p, and resuming one process's checkpoint as pp 2, continue
    within 1e-5 of the uninterrupted run (the layouts differ in the tied
    embedding's last bits, as above)."""
    import shutil
    pp = ["--nproc", "2", "--pp", "2", "--batch-size", "2", "--grad-accum", "4"]
    one = ["--batch-size", "2", "--grad-accum", "4"]

    def leg(name, layout, steps, out, resume):
        args = layout + ["--steps", str(steps), "--out", os.path.join(tmp, out)]
        return train(dtrain, tmp, name, args + (["--resume"] if resume else []), steps)

    straight = train(dtrain, tmp, "ck_straight", pp + ["--steps", "6"], 6)
    straight_one = train(dtrain, tmp, "ck_straight_one", one + ["--steps", "6"], 6)
    leg("ck_first", pp, 3, "ckA", False)
    leg("ck_first_one", one, 3, "ckO", False)
    man = json.load(open(os.path.join(tmp, "ckA", "ckpt-00000003", "manifest.json")))
    owners = [[p[0] for p in sh["pieces"]] for sh in man["shards"]]
    check(len(owners) == 2 and "wte.weight" in owners[0] and "wte.weight" not in owners[1]
          and "ln_f.weight" in owners[1] and "h.3.mlp.c_fc.weight" in owners[1]
          and "h.0.mlp.c_fc.weight" in owners[0],
          "pp 2 checkpoint: a shard per stage, the tied embedding from stage 0 only (%s)"
          % [len(o) for o in owners])
    for d in ("ckB", "ckC"):
        shutil.copytree(os.path.join(tmp, "ckA"), os.path.join(tmp, d))
    same = leg("ck_same", pp, 6, "ckA", True)
    check(same[0] == straight[0][3:] and same_bits(same[1], straight[1]),
          "pp 2 resumed at pp 2: losses and weights bit-identical to the uninterrupted run")
    for name, layout, out, ref in (
            ("ck_to_one", one, "ckB", straight),
            ("ck_to_ppdp", ["--nproc", "4", "--pp", "2", "--batch-size", "1", "--grad-accum",
                            "4", "--pp-schedule", "zb1p"], "ckC", straight),
            ("ck_from_one", pp, "ckO", straight_one)):
        got = leg(name, layout, 6, out, True)
        err, where = rel_err(got[1], ref[1], LR, 6)
        check(err <= 1e-5 and "resumed from" in got[2],
              "%s: resumed, weights within 1e-5 of the uninterrupted run (worst %.2e, %s)"
              % (name, err, where))
    # --init FILE: each stage reads its own ranges of the file.
    init = ["--init", os.path.join(tmp, "ck_straight_one.safetensors")]
    a = train(dtrain, tmp, "init_pp", pp + init)
    b = train(dtrain, tmp, "init_one", one + init)
    err, where = rel_err(a[1], b[1], LR, STEPS)
    check(err <= 1e-5 and a[0][0] == b[0][0] and abs(a[0][0] - straight_one[0][0]) > 1e-3,
          "pp 2 from --init: the first loss %.6f is one process's from the file (%.6f, not the "
          "seed's %.6f), weights within 1e-5 (worst %.2e, %s)"
          % (a[0][0], b[0][0], straight_one[0][0], err, where))


def bad_input(dtrain, tmp):
    base = ["train", "--data", os.path.join(tmp, "data.txt"), "--n-layer", "4", "--n-head", "2",
            "--n-embd", "32", "--block-size", "32", "--steps", "1", "--threads", "1"]
    expect_refused(dtrain, base, [
        (["--nproc", "3", "--pp", "2"], "--pp 2 needs a rank count that 2 divides"),
        (["--nproc", "2", "--pp", "2", "--n-layer", "1"], "need at least 2 layers"),
        (["--nproc", "2", "--pp", "2", "--pp-schedule", "interleaved", "--pp-virtual", "2",
          "--grad-accum", "3"], "not a multiple of p = 2"),
        (["--nproc", "2", "--pp", "2", "--pp-virtual", "2"], "applies to --pp-schedule interleaved"),
        (["--nproc", "2", "--pp", "2", "--pp-schedule", "interleaved", "--pp-virtual", "2",
          "--grad-accum", "2", "--pp-partition", "params"], "its stages are equal"),
        (["--pp-schedule", "gpipe"], "add --pp 2 or more"),
        (["--nproc", "2", "--pp", "2", "--zero-stage", "2"], "use --zero-stage 1, or 0"),
        (["--nproc", "2", "--pp", "2", "--strategy", "ps"], "cannot hold stages"),
    ])


def main():
    dtrain, flags = sys.argv[1], sys.argv[2:]
    schedules = "--schedules" in flags
    quick = schedules or "--quick" in flags
    with tempfile.TemporaryDirectory() as tmp:
        write_words(os.path.join(tmp, "data.txt"), 7)
        equivalence(dtrain, tmp, quick)
        zb1p_halves(dtrain, tmp)
        if not schedules:
            cost_partition(dtrain, tmp, quick)
            activations(dtrain, tmp)
            checkpoints(dtrain, tmp)
        timeline(dtrain, tmp, "1f1b", ("forward", "backward"))
        timeline(dtrain, tmp, "zb1p", ("forward", "backward_input", "backward_weights"))
        if not schedules:
            bad_input(dtrain, tmp)
    finish()


if __name__ == "__main__":
    main()
