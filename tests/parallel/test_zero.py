"""ZeRO stages 1-3 against DDP on the same global batch.

  test_zero.py DTRAIN [--quick]

(--quick: the equivalence at 2 and 3 ranks only, for the sanitizer builds.)

Equivalence (10 steps, AdamW with weight decay, clipping at 1, gradient
accumulation 2, --shuffle 0):
  - at 2 ranks with the default algorithms, at 3 and 4 ranks with the
    rank-order algorithms (DDP's all-reduce `naive`, ZeRO's reduce-scatter
    `direct`): stage 1 ends with the same bits as DDP (weights and every
    logged loss and norm); stages 2 and 3 reduce each micro-batch before
    adding the two, where DDP adds first, so they hold 1e-6 relative;
  - without accumulation (3 ranks) stages 2 and 3 are bit-identical too.
  Every ZeRO run checks that its ranks hold bit-identical (stage 3:
  gathered) parameters and prints so; the test checks the line.
Traffic per step (the transport's own byte counters, in the JSON log):
  stages 1 and 2 send 2 Psi (n-1)/n floats per rank, stage 3 3 Psi (n-1)/n,
  within 5% (the padding of the pieces and the norm's block sums are the
  difference).
Overlap (DTRAIN_ZERO_EVENTS): at stage 3 the gather of layer l+1 is issued
  before layer l's forward ends, and at every stage the reduce-scatters are
  issued before backward ends.
Stage 3's settings (--zero-prefetch 0/3, --zero-reshard-after-forward 0,
  --zero-persist, --zero-max-live, --zero-prefetch-elems) leave the weights
  bit-identical to DDP's, change the order of gathers as they say (events),
  and keeping layers for backward saves backward's gathers (traffic).
Bad input: a stage outside 0-3, a stage under --strategy ps or dp, stage-3
  settings below stage 3, DeepSpeed keys that do not exist here.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
import dtrain_run  # noqa: E402
from dtrain_run import expect_refused, same_bits, train_logged, write_words  # noqa: E402

STEPS = 10


def train(dtrain, tmp, name, extra, model=("2", "2", "32"), env=None):
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".safetensors")
    args = ["train", "--data", os.path.join(tmp, "data.txt"), "--val-fraction", "0",
            "--n-layer", model[0], "--n-head", model[1], "--n-embd", model[2],
            "--block-size", "32", "--batch-size", "2", "--steps", str(STEPS),
            "--lr-schedule", "constant", "--weight-decay", "0.1", "--grad-clip", "1",
            "--shuffle", "0", "--threads", "1", "--log-json", log, "--save-final", final,
            "--lr", "3e-3", "--print-every", "100"] + extra
    return train_logged(dtrain, args, log, final, env)


def rel_err(a, b):
    return dtrain_run.rel_err(a, b, 3e-3, STEPS)


def equivalence(dtrain, tmp, quick):
    rank_order = (["allreduce=naive"], ["reduce_scatter=direct"])
    layouts = [(2, 2, [], []), (3, 2) + rank_order, (4, 2) + rank_order, (3, 1) + rank_order]
    for n, accum, ddp_algo, zero_algo in layouts[:2] if quick else layouts:
        weights = {}
        def algo(a):
            return ["--comm-algo", ",".join(a)] if a else []
        common = ["--nproc", str(n), "--grad-accum", str(accum)]
        ref, ref_w, _ = train(dtrain, tmp, "ddp%d%d" % (n, accum), common + algo(ddp_algo))
        for stage in (1, 2, 3):
            if accum == 1 and stage == 1:
                continue
            what = "ZeRO-%d at %d ranks, accumulation %d" % (stage, n, accum)
            got, got_w, out = train(dtrain, tmp, "z%d%d%d" % (stage, n, accum),
                                    common + ["--zero-stage", str(stage)] + algo(zero_algo))
            check("replicas: %d ranks hold bit-identical weights" % n in out,
                  "%s: every rank holds the same parameters" % what)
            check(len(got) == STEPS, "%s: %d steps logged" % (what, STEPS))
            weights[stage] = got_w
            if stage == 1 or accum == 1:
                check(same_bits(got_w, ref_w), "%s: weights bit-identical to DDP's" % what)
                check([(e["loss"], e["grad_norm"]) for e in got] ==
                      [(e["loss"], e["grad_norm"]) for e in ref],
                      "%s: every loss and norm equal to DDP's" % what)
            else:
                err, worst = rel_err(got_w, ref_w)
                lerr = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(got, ref))
                print("%s: weights within %.2e (worst %s), losses within %.2e of DDP's" %
                      (what, err, worst, lerr))
                check(err <= 1e-6 and lerr <= 1e-6, "%s: within 1e-6 relative of DDP" % what)
        if 2 in weights and 3 in weights:
            check(same_bits(weights[2], weights[3]),
                  "ZeRO-2 and ZeRO-3 at %d ranks, accumulation %d: the same bits (the same "
                  "sums; only where the parameters live differs)" % (n, accum))


def traffic(dtrain, tmp):
    for n in (2, 4):
        for stage in (1, 2, 3):
            what = "ZeRO-%d at %d ranks" % (stage, n)
            got, w, _ = train(dtrain, tmp, "t%d%d" % (stage, n),
                              ["--nproc", str(n), "--zero-stage", str(stage)],
                              model=("2", "2", "96"))
            psi = sum(t.numel() for t in w.values())
            want = (3 if stage == 3 else 2) * psi * (n - 1) / n * 4
            sent = sum(e["bytes_sent"] for e in got[1:]) / (len(got) - 1)
            print("%s: %.0f bytes sent per step, formula %.0f (%.3fx)" % (what, sent, want,
                                                                          sent / want))
            check(abs(sent / want - 1) <= 0.05, "%s: traffic within 5%% of the formula" % what)


def events_of(path):
    ev = []
    for line in open(path):
        if line.split()[1] == "traffic":  # a step's byte counts, not an event
            continue
        step, kind, seg, ns = line.split()
        ev.append((int(step), kind, int(seg), int(ns)))
    return ev


def overlap(dtrain, tmp):
    L = 3
    for stage in (1, 2, 3):
        base = os.path.join(tmp, "events%d" % stage)
        train(dtrain, tmp, "o%d" % stage, ["--nproc", "2", "--zero-stage", str(stage)],
              model=(str(L), "2", "32"), env={"DTRAIN_ZERO_EVENTS": base})
        ev = [e for e in events_of(base + ".0") if e[0] == 5]  # a step in the middle
        t = {}
        for _, kind, seg, ns in ev:
            t.setdefault((kind, seg), ns)  # the first of each in the step
        end = t.get(("grads_end", -1))
        rs = [t.get(("reduce_scatter", s)) for s in range(L + 2)]
        check(end is not None and all(x is not None for x in rs),
              "ZeRO-%d: every segment's reduce-scatter recorded" % stage)
        early = [s for s in range(1, L + 2) if rs[s] is not None and rs[s] < end]
        check(len(early) == L + 1,
              "ZeRO-%d: reduce-scatters of segments %s start before backward ends" %
              (stage, early))
        if stage < 3:
            continue
        for layer in range(L - 1):  # segment 1 + layer
            g = t.get(("gather", 2 + layer))
            fe = t.get(("forward_end", 1 + layer))
            check(g is not None and fe is not None and g < fe,
                  "ZeRO-3: layer %d's gather starts before layer %d's forward ends" %
                  (layer + 1, layer))


def knobs(dtrain, tmp):
    """Stage 3's settings change when and what is gathered, never a number;
    and each does what it says (traffic, the order of events)."""
    ref, ref_w, _ = train(dtrain, tmp, "k_ddp", ["--nproc", "2"], model=("3", "2", "32"))
    variants = {"prefetch0": ["--zero-prefetch", "0"], "prefetch3": ["--zero-prefetch", "3"],
                "keep": ["--zero-reshard-after-forward", "0"], "persist": ["--zero-persist", "1e9"],
                "maxlive": ["--zero-max-live", "5000"], "elems": ["--zero-prefetch-elems", "30000"]}
    bytes_of = {}
    for name, flags in variants.items():
        base = os.path.join(tmp, "kev_" + name)
        got, got_w, _ = train(dtrain, tmp, "k_" + name, ["--nproc", "2", "--zero-stage", "3"] + flags,
                              model=("3", "2", "32"), env={"DTRAIN_ZERO_EVENTS": base})
        check(same_bits(got_w, ref_w), "ZeRO-3 %s: weights bit-identical to DDP's" % " ".join(flags))
        bytes_of[name] = sum(e["bytes_sent"] for e in got[1:]) / (len(got) - 1)
        t = {}
        for step, kind, seg, ns in events_of(base + ".0"):
            if step == 5:
                t.setdefault((kind, seg), ns)
        ahead = t[("gather", 3)] < t[("forward_end", 2)]  # layer 2 gathered during layer 1
        # persistent layers are gathered once, after each update
        want_ahead = name not in ("prefetch0", "maxlive", "persist")
        check(ahead == want_ahead, "ZeRO-3 %s: layer 2 %s during layer 1's forward" %
              (" ".join(flags), "gathered" if want_ahead else "not gathered"))
    # Keeping the layers from forward to backward (or all of them, persistent)
    # saves backward's gathers: about Psi of the 3 Psi.
    for name in ("keep", "persist"):
        check(bytes_of[name] < 0.8 * bytes_of["prefetch3"],
              "ZeRO-3 %s: %.0f bytes a step, below %.0f with layers let go after forward" %
              (name, bytes_of[name], bytes_of["prefetch3"]))


def bad_input(dtrain, tmp):
    base = ["train", "--data", os.path.join(tmp, "data.txt"), "--steps", "1", "--n-layer", "1",
            "--n-head", "1", "--n-embd", "16", "--block-size", "16"]
    cfg = os.path.join(tmp, "ds.json")
    with open(cfg, "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 2,
                   "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu",
                                                                          "buffer_count": 5}}}, f)
    cases = [
        (["--zero-stage", "4"], "zero-stage"),
        (["--zero-stage", "1", "--strategy", "ps", "--nproc", "2"], "--strategy ddp"),
        (["--zero-stage", "2", "--strategy", "dp"], "--strategy ddp"),
        (["--zero-stage", "1", "--zero-prefetch", "2"], "--zero-stage 3"),
        (["--zero-stage", "3", "--zero-prefetch", "1", "--zero-prefetch-elems", "100"],
         "give one of them"),
        (["--config", cfg], "offload_param"),
    ]
    expect_refused(dtrain, base, cases)


def init_file(dtrain, tmp):
    """--init FILE: each rank reads only what it keeps (ZeRO-3 and mixed
    precision read their pieces straight into the shard), and the run is
    DDP's from the same file, bit for bit, in fp32 and bf16."""
    train(dtrain, tmp, "init_src", ["--lr", "3e-2"])
    path = os.path.join(tmp, "init_src.safetensors")
    for dtype in ("fp32", "bf16"):
        _, seed_w, _ = train(dtrain, tmp, "init_none_" + dtype, ["--nproc", "2", "--dtype", dtype])
        common = ["--nproc", "2", "--init", path, "--dtype", dtype]
        _, ref_w, _ = train(dtrain, tmp, "init_ddp_" + dtype, common)
        check(not same_bits(ref_w, seed_w), "--init %s: DDP started from the file, not the "
              "seed's initialisation" % dtype)
        for stage in (1, 3):
            _, got_w, _ = train(dtrain, tmp, "init_z%d_%s" % (stage, dtype),
                                common + ["--zero-stage", str(stage)])
            check(same_bits(got_w, ref_w), "ZeRO-%d %s from --init: weights bit-identical to "
                  "DDP's from the same file" % (stage, dtype))


def main():
    dtrain = sys.argv[1]
    quick = "--quick" in sys.argv[2:]
    with tempfile.TemporaryDirectory() as tmp:
        write_words(os.path.join(tmp, "data.txt"), 3)
        if not quick:
            bad_input(dtrain, tmp)
        equivalence(dtrain, tmp, quick)
        if quick:
            return finish()
        init_file(dtrain, tmp)
        traffic(dtrain, tmp)
        overlap(dtrain, tmp)
        knobs(dtrain, tmp)
    finish()


if __name__ == "__main__":
    main()
