"""Mixed precision (--dtype bf16): bf16 working parameters, fp32 master
weights in the optimizer, gradients reduced in bf16.

  test_mixed_precision.py DTRAIN

Loss: 50 steps in bf16 end within 2% of fp32's (the mean of the last 10
  logged losses), and the runs differ (bf16 really rounds).
Master weights: what --save-final writes are the fp32 masters: after
  training most of them carry bits below bf16's precision, while every
  weight the products read was bf16 (the memory table counts 2 bytes per
  parameter, checked below).
Equivalence: at 2 ranks, a + b = b + a in any precision, so DDP and
  ZeRO-1/2/3 in bf16 must end with the same bits (weights, every loss and
  norm), and every rank holds the same working parameters.
Memory: at the start every rank's parameters, gradients and optimizer
  state are within 5% of the formula for bf16 (P = 2, G = 4 with fp32
  accumulation, K = 12) at each stage, at 2 ranks.
Traffic: per step, DDP and ZeRO-1/2 send 2 Psi (n-1)/n bf16 values, ZeRO-3
  3 Psi (n-1)/n (half of fp32's bytes), within 5%; --comm-dtype fp32 sends
  fp32 gradients again (and ZeRO-1 still gathers bf16 parameters).
Checkpoints: a bf16 ZeRO-3 run saved at step 3 and resumed at 2 ranks with
  DDP ends with the uninterrupted run's bits (the checkpoint holds the fp32
  masters; the working copy is rounded from them).
bf16 gradient accumulation (--grad-accum-dtype bf16, G = 2): 50 steps of
  2 micro-batches end within 2% of fp32's loss and differ from fp32
  accumulation's; at 2 ranks DDP and ZeRO-1/2/3 end with the same bits
  without accumulation, and with 2 micro-batches DDP = ZeRO-1 (both round
  the local sum, then reduce it) and ZeRO-2 = ZeRO-3 (both reduce each
  micro-batch, then round into the bf16 shard); the accounted gradients
  are 2 bytes a parameter (x1.00 of the formula) at every stage; with
  --comm-dtype fp32 DDP sends fp32 values.
Bad input: bf16 with --strategy dp or ps, --comm-dtype outside ddp,
  --grad-accum-dtype bf16 without --dtype bf16, DeepSpeed's fp16.
"""
import json
import os
import re
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import expect_refused, same_bits, train_logged, write_words  # noqa: E402


def train(dtrain, tmp, name, extra, steps=8, model=("2", "2", "64")):
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".safetensors")
    args = ["train", "--data", os.path.join(tmp, "data.txt"), "--val-fraction", "0",
            "--n-layer", model[0], "--n-head", model[1], "--n-embd", model[2],
            "--block-size", "32", "--batch-size", "4", "--steps", str(steps),
            "--weight-decay", "0.1", "--grad-clip", "1", "--shuffle", "0", "--threads", "1",
            "--log-json", log, "--save-final", final, "--lr", "3e-3", "--print-every", "100"]
    return train_logged(dtrain, args + extra, log, final)


def start_ratios(out):
    """Each rank's ratios to the formula (params, grads, optim) in the table
    printed at the start."""
    table = out.split("memory per rank at the start")[1].split("step ")[0]
    rows = [l.split() for l in table.splitlines() if l.strip().startswith("rank ")]
    return [[float(c[1:]) for c in row if c.startswith("x")][:3] for row in rows]


def grads_formula(out):
    """The gradients' column of the formula row printed at the start."""
    table = out.split("memory per rank at the start")[1]
    row = next(l for l in table.splitlines() if l.strip().startswith("formula"))
    return re.split(r"\s{2,}", row.strip())[2]


def loss_and_master(dtrain, tmp):
    fp32, w32, _ = train(dtrain, tmp, "fp32", [], steps=50)
    bf16, w16, out = train(dtrain, tmp, "bf16", ["--dtype", "bf16"], steps=50)
    tail = lambda e: sum(x["loss"] for x in e[-10:]) / 10  # noqa: E731
    a, b = tail(fp32), tail(bf16)
    print("last 10 steps' mean loss: fp32 %.5f, bf16 %.5f (%.3f%%)" % (a, b, 100 * abs(b - a) / a))
    check(len(bf16) == 50 and abs(b - a) <= 0.02 * a, "bf16 within 2% of fp32's loss over 50 steps")
    check(not same_bits(w16, w32), "bf16 and fp32 runs differ (bf16 rounds)")
    low = sum(int(((t.contiguous().view(-1).view(torch.int32) & 0xFFFF) != 0).sum())
              for t in w16.values())
    total = sum(t.numel() for t in w16.values())
    check(low > total // 2, "the saved weights are fp32 masters: %d of %d carry bits below "
          "bf16's precision" % (low, total))
    check("bf16 mixed precision" in out and "2 Psi" in out, "the table names mixed precision")


def equivalence_memory_traffic(dtrain, tmp):
    ref, ref_w, out = train(dtrain, tmp, "ddp", ["--nproc", "2", "--dtype", "bf16"])
    psi = sum(t.numel() for t in ref_w.values())
    runs = {0: (ref, out)}
    for stage in (1, 2, 3):
        what = "bf16 ZeRO-%d at 2 ranks" % stage
        got, got_w, out = train(dtrain, tmp, "z%d" % stage,
                                ["--nproc", "2", "--dtype", "bf16", "--zero-stage", str(stage)])
        runs[stage] = (got, out)
        check(same_bits(got_w, ref_w), "%s: weights bit-identical to bf16 DDP's" % what)
        check([(e["loss"], e["grad_norm"]) for e in got] ==
              [(e["loss"], e["grad_norm"]) for e in ref],
              "%s: every loss and norm equal to DDP's" % what)
        check("replicas: 2 ranks hold bit-identical weights" in out,
              "%s: every rank holds the same working parameters" % what)
    for stage, (entries, out) in runs.items():
        ratios = start_ratios(out)
        ok = len(ratios) == 2 and all(abs(r - 1) <= 0.05 for row in ratios for r in row)
        check(ok, "bf16 stage %d: params, grads, optim at the start within 5%% of the formula "
              "(%s)" % (stage, ratios))
        sent = sum(e["bytes_sent"] for e in entries[1:]) / (len(entries) - 1)
        want = (3 if stage == 3 else 2) * psi * (2 - 1) / 2 * 2
        print("bf16 stage %d: %.0f bytes sent per step, formula %.0f (%.3fx)" %
              (stage, sent, want, sent / want))
        check(abs(sent / want - 1) <= 0.05, "bf16 stage %d: traffic within 5%% of 2-byte "
              "values" % stage)
    got, _, out = train(dtrain, tmp, "z1wire32", ["--nproc", "2", "--dtype", "bf16",
                                                  "--zero-stage", "1", "--comm-dtype", "fp32"])
    sent = sum(e["bytes_sent"] for e in got[1:]) / (len(got) - 1)
    want = psi / 2 * 4 + psi / 2 * 2  # fp32 reduce-scatter, bf16 gather
    check(abs(sent / want - 1) <= 0.05 and "reduce-scattered in fp32" in out,
          "--comm-dtype fp32: fp32 gradients, bf16 parameters (%.0f bytes, formula %.0f)" %
          (sent, want))


def bf16_accumulation(dtrain, tmp):
    micro2 = ["--batch-size", "2", "--grad-accum", "2"]
    fp32, _, _ = train(dtrain, tmp, "acc-fp32", micro2, steps=50)
    acc32, w32, _ = train(dtrain, tmp, "acc-bf16-32", micro2 + ["--dtype", "bf16"], steps=50)
    acc16, w16, _ = train(dtrain, tmp, "acc-bf16-16", micro2 + ["--dtype", "bf16",
                                                               "--grad-accum-dtype", "bf16"],
                          steps=50)
    tail = lambda e: sum(x["loss"] for x in e[-10:]) / 10  # noqa: E731
    a, b = tail(fp32), tail(acc16)
    print("2 micro-batches, last 10 steps' mean loss: fp32 %.5f, bf16 with bf16 accumulation "
          "%.5f (%.3f%%)" % (a, b, 100 * abs(b - a) / a))
    check(len(acc16) == 50 and abs(b - a) <= 0.02 * a,
          "bf16 accumulation within 2% of fp32's loss over 50 steps")
    check(not same_bits(w16, w32), "bf16 accumulation rounds: it differs from fp32 accumulation")
    acc = ["--nproc", "2", "--dtype", "bf16", "--grad-accum-dtype", "bf16"]
    for micro in (1, 2):
        extra = acc + ["--batch-size", str(4 // micro), "--grad-accum", str(micro)]
        runs = {z: train(dtrain, tmp, "acc16-z%d-%d" % (z, micro), extra + ["--zero-stage", str(z)])
                for z in (0, 1, 2, 3)}
        pairs = [(0, 1), (0, 2), (0, 3)] if micro == 1 else [(0, 1), (2, 3)]
        for x, y in pairs:
            check(same_bits(runs[x][1], runs[y][1]) and [e["loss"] for e in runs[x][0]] ==
                  [e["loss"] for e in runs[y][0]],
                  "bf16 accumulation, %d micro-batch(es) at 2 ranks: stage %d and stage %d end "
                  "with the same bits" % (micro, x, y))
        if micro == 1:
            for z, (_, _, out) in runs.items():
                ratios = start_ratios(out)
                ok = len(ratios) == 2 and all(abs(r - 1) <= 0.05 for row in ratios for r in row)
                check(ok and grads_formula(out).startswith("2 Psi"),
                      "bf16 accumulation, stage %d: 2-byte gradients, state within 5%% of the "
                      "formula (%s)" % (z, ratios))
    got, w, out = train(dtrain, tmp, "acc16-wire32", acc + ["--comm-dtype", "fp32"])
    psi = sum(t.numel() for t in w.values())
    sent = sum(e["bytes_sent"] for e in got[1:]) / (len(got) - 1)
    check(abs(sent / (psi * 4) - 1) <= 0.05,
          "bf16 accumulation with --comm-dtype fp32: DDP sends fp32 (%.0f bytes, formula %.0f)"
          % (sent, psi * 4))


def resume(dtrain, tmp):
    ck = os.path.join(tmp, "ck")
    common = ["--nproc", "2", "--dtype", "bf16", "--lr-schedule", "constant"]
    _, full_w, _ = train(dtrain, tmp, "full", common + ["--zero-stage", "3"], steps=6)
    train(dtrain, tmp, "first", common + ["--zero-stage", "3", "--out", ck], steps=3)
    _, res_w, out = train(dtrain, tmp, "rest", common + ["--out", ck, "--resume"], steps=6)
    check("resumed from" in out and same_bits(res_w, full_w),
          "bf16 ZeRO-3 checkpoint resumed with DDP: the uninterrupted run's bits")


def bad_input(dtrain, tmp):
    base = ["train", "--data", os.path.join(tmp, "data.txt"), "--steps", "1", "--n-layer", "1",
            "--n-head", "1", "--n-embd", "16", "--block-size", "16"]
    cfg = os.path.join(tmp, "fp16.json")
    with open(cfg, "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True}}, f)
    cases = [
        (["--dtype", "bf16", "--strategy", "dp"], "--strategy ddp"),
        (["--dtype", "bf16", "--strategy", "ps", "--nproc", "2"], "--strategy ddp"),
        (["--comm-dtype", "bf16", "--strategy", "dp"], "--comm-dtype"),
        (["--comm-dtype", "fp16"], "auto|fp32|bf16"),
        (["--grad-accum-dtype", "bf16"], "needs --dtype bf16"),
        (["--config", cfg], "fp16"),
    ]
    expect_refused(dtrain, base, cases)


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        write_words(os.path.join(tmp, "data.txt"), 5)
        bad_input(dtrain, tmp)
        loss_and_master(dtrain, tmp)
        equivalence_memory_traffic(dtrain, tmp)
        bf16_accumulation(dtrain, tmp)
        resume(dtrain, tmp)
    finish()


if __name__ == "__main__":
    main()
