"""dtrain's Llama family (--arch llama) against PyTorch (tests/pylib/
llama_ref.py, written from the definitions), trained through `dtrain train`.

  test_llama_torch.py DTRAIN

Each case starts both from the same weights (written here in Hugging
Face's LlamaForCausalLM names, read with --init) and the same batches,
runs AdamW with gradient accumulation, clipping and weight decay, and
compares the logged cross-entropy at every step (within 1e-5), then every
final weight (within 1e-4 of the largest value of its tensor: the two sum
in different orders), and that --save-final writes the same names.
Cases (vocabulary 67 and heads that make odd widths on purpose):
  gqa      6 heads, 2 key/value heads (groups of 3), F 40, untied head,
           rope theta 10000
  mha      4 heads, 4 key/value heads, F 24, tied head, theta 500000,
           eps 1e-6
  mqa      4 heads, 1 key/value head, with --recompute full
  mixtral  Mixtral's sparse MLP (--num-experts 4, top 2, SwiGLU experts 24
           wide, router `gate`), with the balance loss and the z-loss: the
           logged balance terms within 1e-4 too; weights within 2e-4 (an
           expert that meets few tokens has gradients near rounding, which
           Adam scales up)
Then, on the first case's weights: DDP over 2 ranks, ZeRO-3 over 2 ranks,
naive data parallelism over 2 devices and the parameter server with 2
workers give one process's final weights bit for bit (--grad-accum 2).
Refused with the values named: key/value heads that do not divide the
heads, an odd head width (rotary pairs), the family's flags without
--arch llama, key/value heads that do not split over tp.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_ref import max_rel_err, param_groups, shard_write, st_read, st_write  # noqa: E402
from dtrain_run import expect_refused, same_bits  # noqa: E402
from llama_ref import Llama  # noqa: E402

torch.set_num_threads(1)
L, V, B, T, ACCUM, STEPS, LR = 2, 67, 3, 24, 2, 5, 3e-3


def torch_train(model, tokens, clip=0.5, wd=0.1):
    """Step s takes sequences s G .. s G + G - 1 (wrapping), micro-batch j
    the j-th block of B: dtrain's order with --shuffle 0. Each step's
    (cross-entropy, balance loss, z-loss)."""
    opt = torch.optim.AdamW(param_groups(model, wd), lr=LR, betas=(0.9, 0.999), eps=1e-8)
    nseq, G = (len(tokens) - 1) // T, B * ACCUM
    log = []
    for s in range(STEPS):
        opt.zero_grad()
        ce_sum = aux_sum = z_sum = 0.0
        for j in range(ACCUM):
            seqs = [(s * G + j * B + b) % nseq for b in range(B)]
            x = torch.tensor(np.stack([tokens[k * T:k * T + T] for k in seqs]), dtype=torch.long)
            y = torch.tensor(np.stack([tokens[k * T + 1:k * T + T + 1] for k in seqs]),
                             dtype=torch.long)
            ce, balance = model(x, y, balance=True)
            ((ce + balance) / ACCUM).backward()
            ce_sum += ce.item() / ACCUM
            for layer in model.layers:
                moe = layer.block_sparse_moe
                if moe is not None:
                    aux_sum += moe.aux * moe.last[0].mean().item() / ACCUM
                    z_sum += moe.z * moe.last[1].mean().item() / ACCUM
        log.append((ce_sum, aux_sum, z_sum))
        for p in model.parameters():  # an expert without rows: a zero gradient, as dtrain's
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return log


def dtrain_args(dtrain, w, data, log, final, extra):
    return [dtrain, "train", "--init", w, "--data", data, "--val-fraction", "0",
            "--eval-batches", "0", "--batch-size", str(B), "--seq-len", str(T),
            "--grad-accum", str(ACCUM), "--steps", str(STEPS), "--lr", str(LR),
            "--lr-schedule", "constant", "--weight-decay", "0.1", "--grad-clip", "0.5",
            "--shuffle", "0", "--threads", "1", "--log-json", log, "--save-final", final] + extra


def run_case(dtrain, tmp, name, NH, KV, C, Fw, theta, eps, tie, extra=(), E=0):
    rng = np.random.default_rng(sum(map(ord, name)))
    model = Llama(L, NH, KV, C, V, Fw, theta, eps, tie, E, 2, 0.01, 0.001)
    model.init_random(torch.Generator().manual_seed(int(rng.integers(1 << 30))))
    w = os.path.join(tmp, name + ".init.safetensors")
    meta = {"n_head": str(NH), "block_size": str(T), "rope_theta": repr(theta),
            "norm_eps": repr(eps)}
    if E:
        meta["moe_router_topk"] = "2"
        extra = list(extra) + ["--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001"]
    st_write(w, model.hf_state(), meta)
    tokens = rng.integers(0, V, size=T * 9 + 1)
    data = os.path.join(tmp, name + ".bin")
    shard_write(data, tokens)
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".safetensors")
    r = subprocess.run(dtrain_args(dtrain, w, data, log, final, list(extra)),
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, "%s: dtrain trained" % name)
    if r.returncode != 0:
        print((r.stdout + r.stderr)[-3000:])
        return None
    logged = [json.loads(line) for line in open(log) if '"loss"' in line]
    ours = [e["loss"] for e in logged]
    ref = torch_train(model, tokens)
    worst = max(abs(o - r[0]) / abs(r[0]) for o, r in zip(ours, ref)) if len(ours) == STEPS \
        else 1.0
    check(worst < 1e-5, "%s: loss within 1e-5 at every step (worst %.1e; %.4f -> %.4f)"
          % (name, worst, ref[0][0], ref[-1][0]))
    for key, i in (("moe_aux_loss", 1), ("moe_z_loss", 2)):
        if E:
            worst = max(abs(e.get(key, 0) - r[i]) / r[i] for e, r in zip(logged, ref))
            check(worst < 1e-4, "%s: %s within 1e-4 at every step (worst %.1e)"
                  % (name, key, worst))
    got, meta = st_read(final)
    want = model.hf_state()
    check(set(got) == set(want), "%s: --save-final writes Hugging Face's names (%s)"
          % (name, sorted(set(got) ^ set(want))[:4]))
    worst, where = 0.0, ""
    for n, p in want.items():
        e = max_rel_err(got[n], p) if n in got else 1.0
        if e > worst:
            worst, where = e, n
    tol = 2e-4 if E else 1e-4
    check(worst < tol, "%s: final weights within %g (worst %.1e in %s)" % (name, tol, worst, where))
    check(meta.get("arch") == "llama" and meta.get("n_kv_head") == str(KV),
          "%s: the file records its family and key/value heads (%s)" % (name, meta))
    return w, data, got


def check_parallel(dtrain, tmp, w, data):
    """The data-parallel strategies: one process's bits."""
    out = {}
    for tag, ranks, extra in (("one", 1, ["--grad-accum", "2"]), ("ddp", 2, []),
                              ("z3", 2, ["--zero-stage", "3"]),
                              ("dp", 1, ["--strategy", "dp", "--devices", "2"]),
                              ("ps", 3, ["--strategy", "ps", "--servers", "1"])):
        log, final = os.path.join(tmp, tag + ".json"), os.path.join(tmp, tag + ".st")
        a = dtrain_args(dtrain, w, data, log, final, extra)
        a[a.index("--grad-accum") + 1] = "2" if tag == "one" else "1"
        if ranks > 1:
            a = [dtrain, "launch", "-n", str(ranks)] + a
        r = subprocess.run(a, capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, "%s: trained%s" % (tag, "" if r.returncode == 0 else
                                                     (r.stdout + r.stderr)[-500:]))
        out[tag] = st_read(final)[0] if r.returncode == 0 else {}
    check(same_bits(out["ddp"], out["one"]), "DDP over 2 ranks: one process's bits")
    check(same_bits(out["z3"], out["one"]), "ZeRO-3 over 2 ranks: one process's bits")
    check(same_bits(out["dp"], out["one"]), "naive DP over 2 devices: one process's bits")
    check(same_bits(out["ps"], out["one"]), "parameter server, 2 workers: one process's bits")


def check_refusals(dtrain, tmp):
    data = os.path.join(tmp, "words.txt")
    with open(data, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog " * 200)
    base = ["train", "--data", data, "--steps", "1", "--n-layer", "2"]
    expect_refused(dtrain, base, [
        (["--arch", "llama", "--n-head", "6", "--n-kv-head", "4", "--n-embd", "48"],
         "4 key/value heads do not divide 6 heads into equal groups; --n-kv-head 1, 2, 3 or 6"),
        (["--arch", "llama", "--n-head", "4", "--n-embd", "36"],
         "n_embd 36 / n_head 4 = 9 is odd"),
        (["--n-kv-head", "2"], "--n-kv-head is an option of the Llama family: add --arch llama"),
        (["--arch", "llama", "--n-head", "8", "--n-kv-head", "2", "--n-embd", "64",
          "--nproc", "4", "--tp", "4"], "--tp 4: the model's 2 key/value heads do not split"),
    ])


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        check_refusals(dtrain, tmp)
        first = run_case(dtrain, tmp, "gqa", 6, 2, 48, 40, 10000.0, 1e-5, False)
        run_case(dtrain, tmp, "mha", 4, 4, 32, 24, 500000.0, 1e-6, True)
        run_case(dtrain, tmp, "mqa", 4, 1, 32, 24, 10000.0, 1e-5, False,
                 ["--recompute", "full"])
        run_case(dtrain, tmp, "mixtral", 4, 2, 32, 24, 10000.0, 1e-5, False, E=4)
        if first:
            check_parallel(dtrain, tmp, first[0], first[1])
    finish()


if __name__ == "__main__":
    main()
