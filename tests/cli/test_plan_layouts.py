"""`dtrain plan` for a model on a cluster (the layout form), against figures
worked out here from the published formulas, not from the program.

  test_plan_layouts.py DTRAIN

Memory: GPT-2 1.5B (gpt2-xl) in bf16 mixed precision on 64 ranks of 80 GiB
(8 hosts of 8, the nvlink-ib preset), data parallelism alone at each ZeRO
stage: the model state per rank is the ZeRO paper's (2 + 2 + 12) Psi,
4 Psi + 12 Psi / N, 2 Psi + 14 Psi / N and 16 Psi / N, N = 64, with Psi
from the GPT-2 parameter count 12 L C^2 + 13 L C + V C + T C + 2 C
(within 0.1%: the program's layout pads tensors to 64 bytes).
Pipeline: at p = 4 with M = 8 micro-batches of equal stages, the step's
bubble over its compute and bubble is (p-1)/(M+p-1) for 1f1b and x/(1+x),
x = (p-1)/(3M), for zb1p (the schedules' closed forms).
The rule: with 80 GiB a rank it says data parallelism, with 16 (the
23 GiB of state does not fit) pipeline parallelism, with 0.25 (one layer's
0.46 GiB of state does not fit) tensor parallelism.
Layouts that do not fit are dropped with the memory they would need; when
none fits the plan says so and exits 1.
Bad input: a missing cluster field, an unknown link model, a batch no
layout splits, a pinned size that has no layout (--tp 3 on hosts of 8: it
names --tp and the sizes that have one, not the batch; ZeRO-3 with a
pipeline: it names the two together and the stages a pipeline takes), more
ranks than a plan weighs (2^31: refused, not wrapped to a negative count);
each exits 2 naming what would work.
The rate measured on this host is announced before it is measured, with
what it costs and --tflops to skip it; a model too large to measure here
is refused at once, pointing at --tflops.
A plan of 2^20 ranks says at once that it is weighing them.
A sequence of odd length has layouts without context parallelism.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402

XL = ["--model", "gpt2-xl", "--global-batch", "512", "--nodes", "8", "--ranks-per-node", "8",
      "--link-model", "nvlink-ib"]


def plan(dtrain, args, timeout=120):
    return subprocess.run([dtrain, "plan"] + args, capture_output=True, text=True,
                          timeout=timeout)


def best(dtrain, args):
    r = plan(dtrain, args + ["--json", "--top", "1"])
    check(r.returncode == 0, "plan %s exits 0 (%s)" % (" ".join(args), r.stderr.strip()[-200:]))
    d = json.loads(r.stdout)
    return d["best"][0] if d["best"] else None


def zero_formulas(dtrain):
    L, C, V, T, N = 48, 1600, 50257, 1024, 64
    psi = 12 * L * C * C + 13 * L * C + V * C + T * C + 2 * C
    want = {0: 16 * psi, 1: 4 * psi + 12 * psi / N, 2: 2 * psi + 14 * psi / N, 3: 16 * psi / N}
    for z, w in want.items():
        b = best(dtrain, XL + ["--mem-per-rank", "80", "--tp", "1", "--cp", "1", "--pp", "1",
                               "--zero-stage", str(z), "--micro-batch", "1", "--recompute",
                               "none"])
        m = b["memory_by_kind"]
        got = m["params"] + m["grads"] + m["optim"]
        check(abs(got - w) <= 1e-3 * w, "ZeRO-%d at N = 64: model state %.4g GB, the paper's "
              "formula %.4g GB" % (z, got / 1e9, w / 1e9))


def bubbles(dtrain):
    base = ["--model", "bench", "--global-batch", "8", "--nodes", "1", "--ranks-per-node", "4",
            "--mem-per-rank", "4", "--tflops", "0.01", "--tp", "1", "--cp", "1", "--pp", "4",
            "--micro-batch", "1", "--recompute", "none", "--zero-stage", "0"]
    p, M = 4, 8
    x = (p - 1) / (3 * M)
    for sched, want in (("1f1b", (p - 1) / (M + p - 1)), ("zb1p", x / (1 + x))):
        b = best(dtrain, base + ["--pp-schedule", sched])
        busy = b["compute_s"] + b["tp_s"] + b["cp_s"]
        got = b["bubble_s"] / (busy + b["bubble_s"])
        check(b["micro_batches"] == M and abs(got - want) <= 1e-9,
              "%s at p 4, M 8: bubble fraction %.6f, closed form %.6f" % (sched, got, want))


def rule(dtrain):
    # at 0.25 GiB nothing fits (a layer's activations alone are 0.1 GiB): exit 1
    for mem, says, rc in (("80", "so the rule says data parallelism", 0),
                          ("16", "so the rule says pipeline parallelism", 0),
                          ("0.25", "so the rule says tensor parallelism", 1)):
        r = plan(dtrain, XL + ["--mem-per-rank", mem])
        check(r.returncode == rc and says in r.stdout, "%s GiB a rank: %r, exit %d (%d)" %
              (mem, says, rc, r.returncode))
    r = plan(dtrain, XL + ["--mem-per-rank", "16"])
    check("need more than the 16.0 GiB a rank has" in r.stdout and "needs" in r.stdout,
          "the dropped layouts say what they would need")
    r = plan(dtrain, XL + ["--mem-per-rank", "0.01"])
    check(r.returncode == 1 and "no layout fits" in r.stdout and "no layout fits" in r.stderr,
          "no layout fits in 0.01 GiB: exit 1 (%d), said on both streams" % r.returncode)


def bad_input(dtrain):
    cases = [
        (XL, "--mem-per-rank"),
        (XL[:-1] + ["warp-drive", "--mem-per-rank", "80"], "nvlink-ib"),
        (["--model", "bench", "--global-batch", "3", "--nodes", "1", "--ranks-per-node", "4",
          "--mem-per-rank", "4", "--tflops", "1", "--tp", "1", "--cp", "1", "--pp", "1"],
         "must divide the batch"),
        (XL + ["--mem-per-rank", "80", "--tp", "3"], "--tp 3: tensor parallelism"),
        (XL[:4] + ["--nodes", "1", "--ranks-per-node", "8", "--link-model", "nvlink-ib",
                   "--mem-per-rank", "80", "--tp", "3"], "25 heads"),
        (XL[:4] + ["--nodes", "1", "--ranks-per-node", "8", "--link-model", "nvlink-ib",
                   "--mem-per-rank", "80", "--tp", "3"], "--tp takes 1 here"),
        (XL + ["--mem-per-rank", "80", "--zero-stage", "3", "--pp", "2"],
         "--zero-stage 3 with --pp 2: ZeRO"),
        (XL + ["--mem-per-rank", "80", "--zero-stage", "3", "--pp", "2"],
         "with --pp 2, --zero-stage takes 0, 1"),
        (["--nodes", "1048576", "--ranks-per-node", "2048", "--global-batch", "512",
          "--mem-per-rank", "80", "--link-model", "nvlink-ib"], "is 2147483648 ranks"),
        (["--nodes", "1048576", "--ranks-per-node", "2048", "--global-batch", "512",
          "--mem-per-rank", "80", "--link-model", "nvlink-ib"], "up to 1048576"),
    ]
    for args, want in cases:
        r = plan(dtrain, args)
        msg = r.stdout + r.stderr
        # a pinned size without a layout is named, and the batch is not blamed for it
        blamed = args[-2:] in (["--tp", "3"], ["--pp", "2"])
        check(r.returncode == 2 and want in msg and not (blamed and "use a batch" in msg),
              "plan %s: exit 2 naming %r (%d: %s)" % (" ".join(args[-4:]), want, r.returncode,
                                                       msg.strip().splitlines()[-1:]))


def odd_sequence(dtrain):
    # without context parallelism nothing cuts the sequence: an odd length has layouts
    r = plan(dtrain, ["--model", "gpt2", "--seq-len", "1023", "--global-batch", "8", "--nodes",
                      "1", "--ranks-per-node", "2", "--mem-per-rank", "80", "--tflops", "10",
                      "--json", "--top", "1"])
    best = json.loads(r.stdout)["best"] if r.returncode == 0 else []
    check(best and best[0]["cp"] == 1, "sequences of 1023 tokens: a layout with cp 1 (%d: %s)" %
          (r.returncode, r.stderr.strip()[-160:]))


def measured(dtrain):
    args = ["--model", "bench", "--global-batch", "16", "--nodes", "1", "--ranks-per-node",
            "2", "--mem-per-rank", "8", "--top", "1"]
    r = plan(dtrain, args)
    said = r.stderr.split("\n")[0]
    check(r.returncode == 0 and "measuring this host's compute rate" in said and
          "GiB" in said and "TFLOP" in said and "--tflops X" in said,
          "the measurement is announced with its cost and --tflops (%r)" % said)
    big = ["--model", "gpt2", "--n-layer", "2", "--n-head", "64", "--n-embd", "8192",
           "--global-batch", "16", "--nodes", "1", "--ranks-per-node", "2",
           "--mem-per-rank", "80"]
    try:
        r = plan(dtrain, big, timeout=20)
        check(r.returncode == 2 and "--tflops" in r.stderr,
              "a model too large to measure is refused (%d: %s)" % (r.returncode,
                                                                     r.stderr.strip()[-200:]))
    except subprocess.TimeoutExpired:
        check(False, "measuring a layer of width 8192 ran past 20 s instead of being refused")


def million(dtrain):
    args = ["--model", "gpt2", "--global-batch", "1048576", "--nodes", "131072",
            "--ranks-per-node", "8", "--mem-per-rank", "80", "--link-model", "nvlink-ib"]
    try:
        r = plan(dtrain, args, timeout=3)
        err = r.stderr
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    check("weighing 4140 layouts of 1048576 ranks" in err,
          "2^20 ranks: a line at once saying it is weighing them (%r)" % err[-200:])


def main():
    dtrain = sys.argv[1]
    zero_formulas(dtrain)
    bubbles(dtrain)
    rule(dtrain)
    bad_input(dtrain)
    odd_sequence(dtrain)
    measured(dtrain)
    million(dtrain)
    finish()


if __name__ == "__main__":
    main()
