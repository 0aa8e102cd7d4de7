"""A pipeline's memory plan per stage, against sizes computed here.

  test_pp_memory_plan.py DTRAIN

The model (5 layers, C = 40, 2 heads, T = 24, the text data's V = 256) is
chosen so that the layout pads: each tensor starts on 64 bytes (16 floats),
so a LayerNorm's 40 floats take 48 and attn.c_attn.bias's 120 take 128.
Psi_q is computed here from the documented sizes (embeddings V C + T C, a
layer 12 C^2 + 13 C in its 12 tensors, ln_f 2 C), each tensor rounded up to
16 floats, and must equal the printed Psi_q exactly; the padding this adds
is also checked to be what it is (56 floats a layer, 16 for ln_f, none for
the embeddings). The MiB figures must equal P, G, K x Psi_q (memory/plan.h)
rounded as printed.

Activations (recompute none; N = B T = 48, a multiple of 16, so no buffer
pads): per micro-batch in flight the stage's input N C, per layer 16 N C +
(4 + NH) N, with the head N C + 2 N + N V + N, with zb1p's split backward 9
N C more a layer and N C; the executor's tokens and targets (4 bytes each)
and received gradient (N C); backward's scratch 9 N C once. In flight:
1f1b min(M, p - q), gpipe M, zb1p min(M, p).

--dry-run: pp 2 and 3 with 1f1b, gpipe and zb1p (M = 4), pp 2 x dp 2, a
params partition (the cut the lightest heaviest stage of every cut), bf16
with fp32 and bf16 gradient accumulation, SGD with and without momentum;
cost refused; gpt2-xl at pp 4 keeps a small peak RSS (no model buffer).

A real run, pp 2 (1f1b and zb1p, fp32): the plan printed beside each
rank's measured figures is the dry run's; params and optim measured equal
the plan (ratio x1.0000, and the plan equal to the figures here), grads
the plan and the one segment a later micro-batch's gradient is formed in
apart (model/gpt.h; a layer's here);
acts equal it up to the matmul kernels' per-thread workspace record (about
100 bytes, counted as activations; at most 1 KiB allowed). bf16 with bf16
accumulation, zb1p: optim exact (K = 12), params and grads above the plan
by at most the transient windows the plan prints, and by exactly them
here (a layer's segment widened, and a layer's fp32 gradient open: each
half of zb1p's backward closes what it opened, so the tied copy's is
never open beside a layer's).
"""
import itertools
import os
import re
import resource
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402

L, C, NH, T, V, B, M = 5, 40, 2, 24, 256, 2, 4
N = B * T
MIB = 1048576.0


def pad(n):
    return (n + 15) // 16 * 16


LAYER = [C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C]
EMB, LNF = [V * C, T * C], [C, C]
assert sum(LAYER) == 12 * C * C + 13 * C


def seg(tensors):
    return sum(pad(x) for x in tensors)


def psi_q(q, p, layers):
    """Floats stage q of p holds: its layers, the embeddings on the first
    and (tied) the last, ln_f on the last; each tensor padded to 16."""
    last = q == p - 1
    return layers * seg(LAYER) + (seg(EMB) if q == 0 or last else 0) + (seg(LNF) if last else 0)


def in_flight(kind, p, q):
    return {"gpipe": M, "1f1b": min(M, p - q), "zb1p": min(M, p)}[kind]


def acts_bytes(kind, layers, head, slots):
    zb = kind == "zb1p"
    f = N * C + layers * (16 * N * C + (4 + NH) * N)
    if head:
        f += N * C + 2 * N + N * V + N
    if zb:
        f += layers * 9 * N * C + N * C
    per_slot = 4 * f + 2 * N * 4 + N * C * 4
    return slots * per_slot + 9 * N * C * 4


def uniform_cut(S):
    cut = [0]
    for k in range(S):
        cut.append(cut[-1] + L // S + (k < L % S))
    return cut


def run(dtrain, args, timeout=120):
    return subprocess.run([dtrain] + args, capture_output=True, text=True, timeout=timeout)


def base(tmp):
    return ["--data", os.path.join(tmp, "data.txt"), "--n-layer", str(L), "--n-head", str(NH),
            "--n-embd", str(C), "--block-size", str(T), "--batch-size", str(B),
            "--grad-accum", str(M)]


ROW = re.compile(r"^  (\d+) +([0-9,-]+) +(\d+) +(\d+) +([0-9.]+) +([0-9.]+) +([0-9.]+) +"
                 r"([0-9.]+) +([0-9.]+) +([0-9.]+) MiB$", re.M)


def dry(dtrain, tmp, name, extra):
    """The dry run's rows: {stage: (layers, psi, flight, [params, grads,
    optim, state, acts, total] as printed)}, and its stdout."""
    r = run(dtrain, ["train", "--dry-run"] + base(tmp) + extra)
    rows = {int(m[0]): (m[1], int(m[2]), int(m[3]), list(m[4:10])) for m in ROW.findall(r.stdout)}
    ok = r.returncode == 0 and "step " not in r.stdout and rows
    check(ok, "%s: a dry run with a row per stage (exit %d)%s" % (
        name, r.returncode, "" if ok else "\n" + r.stdout[-2000:] + r.stderr[-2000:]))
    return rows, r.stdout


def span(layers):
    lo, _, hi = layers.partition("-")
    return int(lo), int(hi or lo) + 1


def expect_row(name, q, p, kind, row, PGK, cut=None):
    layers, psi, flight, figs = row
    lo, hi = span(layers)
    if cut:
        check((lo, hi) == (cut[q], cut[q + 1]), "%s stage %d: layers %s, the uniform cut's "
              "[%d, %d)" % (name, q, layers, cut[q], cut[q + 1]))
    want_psi = psi_q(q, p, hi - lo)
    slots = in_flight(kind, p, q)
    acts = acts_bytes(kind, hi - lo, q == p - 1, slots)
    state = sum(PGK) * want_psi
    want = ["%.1f" % (b * want_psi / MIB) for b in PGK]
    want += ["%.1f" % (state / MIB), "%.1f" % (acts / MIB), "%.1f" % ((state + acts) / MIB)]
    check(psi == want_psi and flight == slots and figs == want,
          "%s stage %d: Psi_q %d (want %d), %d in flight (want %d), MiB %s (want %s)"
          % (name, q, psi, want_psi, flight, slots, figs, want))
    return want_psi, acts


def padding_accounted():
    """The padding the layout adds, named: what Psi_q counts beyond the
    documented sizes."""
    check(seg(LAYER) - (12 * C * C + 13 * C) == 56 and seg(LNF) - 2 * C == 16
          and seg(EMB) == V * C + T * C,
          "padding: 56 floats a layer (its 4 LayerNorm tensors and 2 c_proj biases of 40 -> 48 "
          "each, c_attn.bias 120 -> 128), 16 for ln_f, none for the embeddings")


def dry_schedules(dtrain, tmp):
    for p, kind in itertools.product((2, 3), ("1f1b", "gpipe", "zb1p")):
        name = "dry pp %d %s" % (p, kind)
        rows, out = dry(dtrain, tmp, name, ["--nproc", str(p), "--pp", str(p),
                                            "--pp-schedule", kind])
        check(len(rows) == p and "4 Psi_q         4 Psi_q         8 Psi_q         16 Psi_q"
              in out, "%s: %d rows and the fp32 AdamW formulas" % (name, len(rows)))
        cut = uniform_cut(p)
        for q in sorted(rows):
            expect_row(name, q, p, kind, rows[q], (4, 4, 8), cut)


def dry_dp_and_params(dtrain, tmp):
    rows, out = dry(dtrain, tmp, "dry pp 2 x dp 2", ["--nproc", "4", "--pp", "2"])
    check("its N = 2 data-parallel copies (DDP within the stage) hold the same" in out
          and "pipeline of 2 stages over 4 ranks" in out,
          "dry pp 2 x dp 2: says once that a stage's copies hold the same")
    for q in sorted(rows):
        expect_row("dry pp 2 x dp 2", q, 2, "1f1b", rows[q], (4, 4, 8), uniform_cut(2))
    rows, out = dry(dtrain, tmp, "dry pp 3 params", ["--nproc", "3", "--pp", "3",
                                                     "--pp-partition", "params"])
    spans = [span(rows[q][0]) for q in sorted(rows)]
    cut = [s[0] for s in spans] + [spans[-1][1]]

    def heaviest(c):
        return max(psi_q(q, 3, c[q + 1] - c[q]) for q in range(3))
    best = min(heaviest((0,) + c + (L,)) for c in itertools.combinations(range(1, L), 2))
    check(heaviest(cut) == best, "dry pp 3 params: the cut %s has the lightest heaviest stage "
          "(%d floats)" % (cut, best))
    for q in sorted(rows):
        expect_row("dry pp 3 params", q, 3, "1f1b", rows[q], (4, 4, 8))


def dry_precisions(dtrain, tmp):
    """P, G, K of memory/plan.h at stage 0, over Psi_q."""
    cases = [("bf16", ["--dtype", "bf16"], (2, 4, 12), "bf16 mixed precision"),
             ("bf16, bf16 accumulation", ["--dtype", "bf16", "--grad-accum-dtype", "bf16"],
              (2, 2, 12), "fp32 gradients of the segments backward holds open"),
             ("sgd momentum", ["--optimizer", "sgd", "--momentum", "0.9"], (4, 4, 4), "sgd (K = 4"),
             ("sgd plain", ["--optimizer", "sgd", "--momentum", "0"], (4, 4, 0), "sgd (K = 0")]
    for name, extra, PGK, needle in cases:
        rows, out = dry(dtrain, tmp, "dry " + name, ["--nproc", "2", "--pp", "2"] + extra)
        check(needle in out, "dry %s: says %r" % (name, needle))
        for q in sorted(rows):
            expect_row("dry " + name, q, 2, "1f1b", rows[q], PGK, uniform_cut(2))


def dry_refusals_and_rss(dtrain, tmp):
    r = run(dtrain, ["train", "--dry-run"] + base(tmp) + ["--nproc", "2", "--pp", "2",
                                                          "--pp-partition", "cost"])
    check(r.returncode != 0 and "--dry-run with --pp-partition cost: the cut depends on times "
          "measured when the run starts; plan with uniform or params" in r.stderr,
          "dry pp cost: refused (exit %d: %s)" % (r.returncode, r.stderr.strip()))
    r = run(dtrain, ["train", "--dry-run", "--model", "gpt2-xl", "--nproc", "4", "--pp", "4",
                     "--grad-accum", "8", "--data", os.path.join(tmp, "data.txt")])
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    check(r.returncode == 0 and len(ROW.findall(r.stdout)) == 4 and rss <= 65536,
          "dry gpt2-xl pp 4: 4 rows, peak RSS %d KiB (want under 64 MiB: nothing of the "
          "model allocated)" % rss)


PLAN = re.compile(r"^  rank (\d+) \(stage (\d+), (\d+) in flight\): params ([0-9.]+) MiB .*\n"
                  r"    plan, Psi_q = (\d+): params ([0-9.]+) MiB x([0-9.]+) \| grads ([0-9.]+) "
                  r"MiB x([0-9.]+) \| optim ([0-9.]+) MiB x([0-9.]+) \| acts ([0-9.]+) MiB "
                  r"x([0-9.]+) \|", re.M)


def table(name, out, title="peak memory per rank:"):
    at = out.find(title)
    got = {int(m[1]): m for m in PLAN.findall(out[at:])} if at >= 0 else {}
    check(len(got) == 2, "%s: a plan line under each rank's measured line%s"
          % (name, "" if len(got) == 2 else "\n" + out[-2500:]))
    return got


def real_fp32(dtrain, tmp):
    for kind in ("1f1b", "zb1p"):
        name = "run pp 2 %s" % kind
        args = base(tmp) + ["--nproc", "2", "--pp", "2", "--pp-schedule", kind]
        rows, _ = dry(dtrain, tmp, "dry " + name, args[len(base(tmp)):])
        r = run(dtrain, ["train"] + args + ["--steps", "1", "--threads", "1",
                                            "--eval-batches", "1"])
        got = table(name, r.stdout + r.stderr)
        for q, m in sorted(got.items()):
            psi, acts = expect_row(name + " (dry)", q, 2, kind, rows[q], (4, 4, 8), uniform_cut(2))
            planned = [m[5], m[7], m[9], m[11]]
            check(int(m[4]) == psi and planned[:3] == rows[q][3][:3] and planned[3] ==
                  rows[q][3][4], "%s rank %d: plan Psi_q %s and MiB %s, the dry run's (%d, %s)"
                  % (name, q, m[4], planned, psi, rows[q][3]))
            ratios = [m[6], m[10]]
            check(ratios == ["1.0000"] * 2, "%s rank %d: params, optim measured / planned %s"
                  % (name, q, ratios))
            # The step's later micro-batches form their gradients apart, a
            # segment at a time (the largest here is a layer's).
            grads, grads_win = 4 * psi * float(m[8]), 4 * max(seg(LAYER), seg(EMB))
            check(abs(grads - (4 * psi + grads_win)) <= 2e-4 * psi,
                  "%s rank %d: grads %.0f bytes (want 4 Psi_q + a segment apart = %d)"
                  % (name, q, grads, 4 * psi + grads_win))
            extra = float(m[12]) * acts - acts
            check(-0.00005 * acts <= extra <= 1024 + 0.00005 * acts,
                  "%s rank %d: acts measured %+.0f bytes from the plan's %d (the kernels' "
                  "workspace record; at most 1 KiB)" % (name, q, extra, acts))


def real_bf16(dtrain, tmp):
    """bf16, bf16 accumulation, zb1p: the measured peaks above the plan by
    the windows: a layer widened and a layer's fp32 gradient open (the
    largest segment in use on both stages here; zb1p's input half only
    reads the tied copy, so its gradient opens in the weight half alone)."""
    name = "run pp 2 zb1p bf16"
    r = run(dtrain, ["train"] + base(tmp) + [
        "--nproc", "2", "--pp", "2", "--pp-schedule", "zb1p", "--dtype", "bf16",
        "--grad-accum-dtype", "bf16", "--steps", "1", "--threads", "1", "--eval-batches", "1"])
    got = table(name, r.stdout + r.stderr)
    layer, emb = seg(LAYER), seg(EMB)
    for q, m in sorted(got.items()):
        psi = psi_q(q, 2, 3 if q == 0 else 2)
        params, grads = 2 * psi * float(m[6]), 2 * psi * float(m[8])
        grads_win = 4 * max(emb, layer)
        check(int(m[4]) == psi and m[10] == "1.0000", "%s rank %d: Psi_q %s (want %d), optim "
              "12 Psi_q exactly (x%s)" % (name, q, m[4], psi, m[10]))
        check(abs(params - (2 * psi + 4 * layer)) <= 2e-4 * psi and
              abs(grads - (2 * psi + grads_win)) <= 2e-4 * psi,
              "%s rank %d: params %.0f bytes (want 2 Psi_q + a layer widened = %d), grads "
              "%.0f (want 2 Psi_q + %d in fp32 = %d)" % (name, q, params, 2 * psi + 4 * layer,
                                                         grads, grads_win, 2 * psi + grads_win))
    out = r.stdout
    check("transient, beyond the plan: parameters widened to fp32 while in use" in out and
          "at most %.1f MiB" % (4 * (emb + layer) / MIB) in out,
          "%s: the plan names the transient windows" % name)


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        words = "the quick brown fox jumps over the lazy dog ".split()
        with open(os.path.join(tmp, "data.txt"), "w") as f:
            f.write(" ".join(words[i % 9] for i in range(20000)))
        padding_accounted()
        dry_schedules(dtrain, tmp)
        dry_dp_and_params(dtrain, tmp)
        dry_precisions(dtrain, tmp)
        dry_refusals_and_rss(dtrain, tmp)
        real_fp32(dtrain, tmp)
        real_bf16(dtrain, tmp)
    finish()


if __name__ == "__main__":
    main()
