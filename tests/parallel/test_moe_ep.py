"""Expert parallelism (--ep) against one process on the same global batch,
against PyTorch, and its checkpoints across expert-parallel sizes.

  test_moe_ep.py DTRAIN

- ep 2 over 2 ranks at GPT-2's shapes (2 layers of 768, vocabulary 50257,
  4 experts 1000 wide, a sequence of 40), top-2 and top-1 with both
  balance losses and a capacity: the losses, balance terms, dropped slots,
  validation loss and final weights of one process with --grad-accum 2,
  bit for bit (each expert runs each source rank's rows as its own
  product, the rows one process runs for that micro-batch, and adds a
  later rank's weight gradient once, as one process adds a later
  micro-batch's).
- ep 4 over 4 ranks with a rank-order all-reduce (DTRAIN_ALLREDUCE_ALGO=
  naive): one process with --grad-accum 4, bit for bit. With the default
  all-reduce, ep 2 with DDP over dp 4, and ep 2 with ZeRO-3 over dp 4:
  within 1e-5 (a ring over 3 or more ranks, and the expert-data-parallel
  sum of the group's sums, add in other orders); ep 2 inside each stage of
  a 2-stage pipeline, within 1e-5 (the tied embedding's stages too); ep 2
  x tp 2 with sequence parallelism, with SGD, within 1e-5 (the row-
  parallel sums); ep 2 x cp 2, with SGD, within 1e-5.
- a router forced to send every token to experts 0 and 1: ep rank 1
  receives no rows for whole steps; still one process's bits; --trace
  shows each rank's dispatch, experts and combine.
- --moe-router-force-load-balancing (Megatron's benchmarking router) over
  the forced router above: every expert takes a near-even share, the
  router's weights do not move (weight decay 0), ep 2 gives one process's
  bits, and the log carries the busiest ep rank's share.
- checkpoints: saved at ep 4, resumed at ep 2 (the bits of resuming one
  process's checkpoint there) and in one process (the uninterrupted run's
  bits); `ckpt consolidate` names every expert.
- bf16 mixed precision, and ZeRO-3 with NVMe offload of the optimizer and
  the parameters: ep 2 over 2 ranks, one process's bits.
- recomputation: ep 2 with --recompute full (its rebuild exchanges the
  rows again) and selective, one process's bits.
- refusals: experts that do not split over ep, an ep that does not divide
  the data-parallel ranks, ep without experts.
"""
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_ref import st_read, st_write  # noqa: E402
from dtrain_run import expect_refused, rel_err, run, same_bits, train_logged, write_words  # noqa: E402
from moe_ref import MoEGPT  # noqa: E402

GPT2 = ["--model", "gpt2", "--n-layer", "2", "--num-experts", "4", "--moe-ffn-hidden-size",
        "1000", "--seq-len", "40", "--batch-size", "1", "--steps", "2", "--lr", "1e-3",
        "--moe-z-loss-coeff", "0.001", "--eval-batches", "2"]
TINY = ["--num-experts", "4", "--n-layer", "2", "--batch-size", "2", "--seq-len", "32",
        "--steps", "3", "--moe-z-loss-coeff", "0.001", "--eval-batches", "4"]
COMMON = ["--shuffle", "0", "--threads", "1", "--print-every", "100"]


def train(dtrain, tmp, name, ranks, args, env=None):
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".st")
    a = ["train", "--data", os.path.join(tmp, "words.txt"), "--log-json", log,
         "--save-final", final] + COMMON + args
    if ranks > 1:
        a = ["launch", "-n", str(ranks), dtrain] + a
    entries, weights, out = train_logged(dtrain, a, log, final, env)
    val = [l for l in out.splitlines() if l.startswith("val loss")]
    return [(e["loss"], e["moe_aux_loss"], e["moe_z_loss"], e["moe_dropped"])
            for e in entries], weights, val


def same(got, ref, what):
    check(got[0] == ref[0] and got[2] == ref[2] and same_bits(got[1], ref[1]),
          "%s: losses, balance terms, drops, validation loss and final weights of one process, "
          "bit for bit" % what)


def close(got, ref, what):
    worst = max(abs(a[0] - b[0]) / b[0] for a, b in zip(got[0], ref[0]))
    err, where = rel_err(got[1], ref[1], 1e-3, 3)
    check(worst <= 1e-6 and err <= 1e-5, "%s: losses within 1e-6 of one process (%.1e), "
          "weights within 1e-5 (%.1e, %s)" % (what, worst, err, where))


def check_gpt2_shapes(dtrain, tmp):
    for tag, extra in (("top2", ["--moe-router-topk", "2"]),
                       ("top1", ["--moe-router-topk", "1", "--moe-expert-capacity-factor", "1.0",
                                 "--moe-aux-loss-coeff", "0.05"])):
        one = train(dtrain, tmp, tag + "_one", 1, GPT2 + extra + ["--grad-accum", "2"])
        ep2 = train(dtrain, tmp, tag + "_ep2", 2, GPT2 + extra + ["--ep", "2"])
        same(ep2, one, "gpt2 shapes, %s, ep 2 over 2 ranks" % tag)
    check(any(d > 0 for *_, d in one[0]), "top1 with capacity 1.0 dropped slots (%s)"
          % [d for *_, d in one[0]])


def check_four(dtrain, tmp):
    one = train(dtrain, tmp, "one4", 1, TINY + ["--grad-accum", "4"])
    ep4 = train(dtrain, tmp, "ep4", 4, TINY + ["--ep", "4"], {"DTRAIN_ALLREDUCE_ALGO": "naive"})
    same(ep4, one, "ep 4 over 4 ranks, rank-order all-reduce")
    close(train(dtrain, tmp, "ep2dp4", 4, TINY + ["--ep", "2"]), one, "ep 2 x DDP over dp 4")
    close(train(dtrain, tmp, "ep2z3", 4, TINY + ["--ep", "2", "--zero-stage", "3"]), one,
          "ep 2 x ZeRO-3 over dp 4")
    close(train(dtrain, tmp, "ep2pp2", 4, TINY + ["--ep", "2", "--pp", "2", "--grad-accum", "2"]),
          one, "ep 2 x pp 2 (1f1b, 2 micro-batches)")
    # With tensor parallelism, SGD: AdamW's first steps would turn the row-
    # parallel sums' rounding into whole steps (test_gpt2_shapes.py).
    sgd = ["--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.01"]
    one2 = train(dtrain, tmp, "one2sgd", 1, TINY + sgd + ["--grad-accum", "2"])
    ept = train(dtrain, tmp, "ep2tp2", 4, TINY + sgd + ["--ep", "2", "--tp", "2",
                                                       "--sequence-parallel"])
    close(ept, one2, "ep 2 x tp 2 with sequence parallelism (SGD)")
    epc = train(dtrain, tmp, "ep2cp2", 4, TINY + sgd + ["--ep", "2", "--cp", "2"])
    close(epc, one2, "ep 2 x cp 2 (ring attention, SGD)")
    check(len(ept[1]) == len(one2[1]), "ep 2 x tp 2: --save-final gathers every slice of every "
          "expert (%d tensors)" % len(ept[1]))


def check_recompute(dtrain, tmp):
    one = train(dtrain, tmp, "rc_one", 1, TINY + ["--grad-accum", "2"])
    for mode in ("full", "selective"):
        same(train(dtrain, tmp, "rc_" + mode, 2, TINY + ["--ep", "2", "--recompute", mode]), one,
             "ep 2 with --recompute %s" % mode)


def check_precision_offload(dtrain, tmp):
    """bf16 mixed precision (gradients reduced in fp32), and ZeRO-3 with the
    optimizer state and the parameters' pieces on NVMe: ep 2 over 2 ranks
    still gives one process's bits."""
    bf16 = ["--dtype", "bf16", "--comm-dtype", "fp32"]
    same(train(dtrain, tmp, "bf_ep2", 2, TINY + bf16 + ["--ep", "2"]),
         train(dtrain, tmp, "bf_one", 1, TINY + bf16 + ["--grad-accum", "2"]),
         "bf16, ep 2 over 2 ranks")
    nvme = os.path.join(tmp, "nvme")
    os.makedirs(nvme, exist_ok=True)
    same(train(dtrain, tmp, "nv_ep2", 2, TINY + ["--ep", "2", "--zero-stage", "3",
                                                 "--offload-optimizer", "nvme", "--offload-param",
                                                 "nvme", "--nvme-path", nvme]),
         train(dtrain, tmp, "nv_one", 1, TINY + ["--grad-accum", "2"]),
         "ep 2 x ZeRO-3 with the optimizer and parameters on NVMe")


def forced_init(tmp):
    """Weights whose router gives every token the logits [4, 1, 0, -30]
    (ln_2 outputs its bias alone): experts 0 and 1 take every slot."""
    model = MoEGPT(2, 4, 128, 256, 128, 4, 512, 2)
    model.init_random(torch.Generator().manual_seed(5), scale=0.02)
    with torch.no_grad():
        for layer in model.h:
            v = layer.ln_2.bias
            layer.ln_2.weight.zero_()
            layer.mlp.router.weight.copy_(torch.tensor([4.0, 1.0, 0.0, -30.0]).unsqueeze(1) *
                                          v.unsqueeze(0) / (v @ v))
    w = os.path.join(tmp, "forced.safetensors")
    st_write(w, model.hf_state(), {"n_head": "4"})
    return w


def check_forced(dtrain, tmp):
    """The forced router: ep rank 1 (experts 2, 3) receives no rows."""
    args = ["--init", forced_init(tmp), "--batch-size", "2", "--seq-len", "32", "--steps", "2",
            "--eval-batches", "0", "--lr", "1e-4", "--moe-per-layer-logging"]
    one = train(dtrain, tmp, "forced_one", 1, args + ["--grad-accum", "2"])
    trace = os.path.join(tmp, "forced.trace")
    r = run(dtrain, ["launch", "-n", "2", dtrain, "train", "--data",
                     os.path.join(tmp, "words.txt")] + COMMON + args + ["--ep", "2", "--trace",
                                                                        trace])
    check(r.returncode == 0 and "slots per expert min 0 " in r.stdout,
          "forced: ep 2 trained with experts that took no slot (%s)"
          % [l for l in r.stdout.splitlines() if "moe layer" in l][:2])
    events = json.load(open(trace))["traceEvents"] if r.returncode == 0 else []
    seen = {(e.get("pid"), e.get("name")) for e in events}
    want = {(p, n) for p in (0, 1) for n in ("moe dispatch", "moe experts", "moe combine",
                                             "moe experts backward")}
    check(want <= seen, "--trace: each rank's dispatch, experts and combine (missing %s)"
          % sorted(want - seen))
    ep2 = train(dtrain, tmp, "forced_ep2", 2, args + ["--ep", "2"])
    same(ep2, one, "forced router, ep rank 1 without rows")


def check_force_balance(dtrain, tmp):
    w = forced_init(tmp)
    args = ["--init", w, "--batch-size", "2", "--seq-len", "32", "--steps", "2",
            "--eval-batches", "0", "--lr", "1e-3", "--weight-decay", "0",
            "--moe-router-force-load-balancing", "--moe-per-layer-logging"]
    one = train(dtrain, tmp, "even_one", 1, args + ["--grad-accum", "2"])
    log, final = os.path.join(tmp, "even_ep2.json"), os.path.join(tmp, "even_ep2.st")
    entries, weights, out = train_logged(dtrain, ["launch", "-n", "2", dtrain, "train", "--data",
                                                  os.path.join(tmp, "words.txt"), "--log-json",
                                                  log, "--save-final", final, "--ep", "2"]
                                         + COMMON + args, log, final)
    loads = [l for l in out.splitlines() if "moe layer" in l]
    shares = [float(l.split("max/mean ")[1].split(")")[0]) for l in loads]
    check(len(loads) >= 2 and max(shares) < 1.5 and "min 0 " not in out,
          "forced balance over a router that sends every token to experts 0 and 1: each layer's "
          "busiest expert under 1.5x the mean, none idle (%s)" % shares)
    check(all(0.99 < e.get("moe_ep_skew", 0) < 1.5 for e in entries),
          "--log-json's moe_ep_skew: the busiest ep rank's share (%s)"
          % [e.get("moe_ep_skew") for e in entries])
    init = st_read(w)[0]
    routers = [k for k in weights if k.endswith("mlp.router.weight")]
    check(len(routers) == 2 and all(weights[k].equal(init[k]) for k in routers) and
          not weights["h.0.mlp.experts.2.c_fc.weight"].equal(init["h.0.mlp.experts.2.c_fc.weight"]),
          "forced balance: the router's weights stay as loaded, the experts train")
    same(([(e["loss"], e["moe_aux_loss"], e["moe_z_loss"], e["moe_dropped"]) for e in entries],
          weights, [l for l in out.splitlines() if l.startswith("val loss")]), one,
         "forced balance, ep 2")


def check_checkpoints(dtrain, tmp):
    base = TINY[:-2] + ["--steps", "4", "--eval-batches", "0", "--lr-schedule", "constant"]
    naive = {"DTRAIN_ALLREDUCE_ALGO": "naive"}
    out, one_out = os.path.join(tmp, "ck4"), os.path.join(tmp, "ck1")
    full = train(dtrain, tmp, "ck_full", 4, base + ["--ep", "4", "--out", out,
                                                    "--save-every", "2"], naive)
    one_ck = train(dtrain, tmp, "ck_one", 1, base + ["--grad-accum", "4", "--out", one_out,
                                                     "--save-every", "2"])
    at = os.path.join(out, "ckpt-00000002")
    res1 = train(dtrain, tmp, "res1", 1, base + ["--grad-accum", "4", "--resume=" + at])
    check(same_bits(res1[1], full[1]), "saved at ep 4, resumed in one process: the "
          "uninterrupted run's final weights, bit for bit")
    res2 = train(dtrain, tmp, "res2", 2, base + ["--ep", "2", "--grad-accum", "2",
                                                "--resume=" + at])
    ref2 = train(dtrain, tmp, "res2ref", 2, base + ["--ep", "2", "--grad-accum", "2",
                 "--resume=" + os.path.join(one_out, "ckpt-00000002")])
    check(same_bits(one_ck[1], full[1]), "one process's run is ep 4's, bit for bit")
    check(same_bits(res2[1], ref2[1]), "saved at ep 4, resumed at ep 2: the bits of resuming "
          "one process's checkpoint there")
    close(res2, (full[0][2:], full[1]), "ep 4 -> ep 2 against the uninterrupted run (steps 3-4)")
    cons = os.path.join(tmp, "cons.st")
    r = run(dtrain, ["ckpt", "consolidate", at, "--out", cons])
    names = st_read(cons)[0] if r.returncode == 0 else {}
    check(all("h.%d.mlp.experts.%d.c_fc.weight" % (l, e) in names for l in range(2)
              for e in range(4)), "ckpt consolidate of the ep 4 checkpoint names every expert")


def check_refusals(dtrain, tmp):
    base = ["train", "--data", os.path.join(tmp, "words.txt"), "--steps", "1"]
    expect_refused(dtrain, base, [
        (["--nproc", "2", "--num-experts", "3", "--ep", "2"],
         "the 3 experts do not split into 2 equal parts; --expert-model-parallel-size 1 or 3"),
        (["--nproc", "3", "--num-experts", "4", "--ep", "2"], "which it does not divide"),
        (["--nproc", "2", "--ep", "2"], "add --num-experts E"),
    ])


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        write_words(os.path.join(tmp, "words.txt"), 9)
        check_refusals(dtrain, tmp)
        check_gpt2_shapes(dtrain, tmp)
        check_forced(dtrain, tmp)
        check_force_balance(dtrain, tmp)
        check_recompute(dtrain, tmp)
        check_precision_offload(dtrain, tmp)
        check_four(dtrain, tmp)
        check_checkpoints(dtrain, tmp)
    finish()


if __name__ == "__main__":
    main()
