"""dtrain's mixture of experts against PyTorch (tests/pylib/moe_ref.py,
written from the definitions), trained through `dtrain train`.

  test_moe_torch.py DTRAIN

Each case starts both from the same weights (written here, read with
--init) and the same batches, runs AdamW with gradient accumulation,
clipping and weight decay, and compares at every step the logged
cross-entropy, the balance loss and the z-loss, and the dropped slots;
then every final weight (within 1e-4 of the largest value of its tensor:
the two sum in different orders). Cases:
  top2      E 4, K 2, F 40 (not 4 C), both balance losses, dropless
  top1cap   E 4, K 1, capacity factor 1.0 (slots dropped), aux only
  k_eq_e    K = E = 3
  forced    a router that sends every token to experts 0 and 1 (a tie
            between 1 and 2, which goes to the lower index): experts 2
            and 3 receive no tokens for whole steps
  one       K 1 and every token to expert 1, capacity 1.0: most dropped
  bias      aux-loss-free balancing: the experts' bias moved each step by
            the step's load (--moe-router-enable-expert-bias)
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
from moe_ref import MoEGPT  # noqa: E402

torch.set_num_threads(1)
L, H, C, V, MAXT, B, T, ACCUM, STEPS, LR = 2, 2, 32, 64, 32, 3, 24, 2, 5, 3e-3


def torch_train(model, tokens, clip=0.5, wd=0.1):
    """Step s takes sequences s G .. s G + G - 1 (wrapping), micro-batch j
    the j-th block of B: dtrain's order with --shuffle 0."""
    opt = torch.optim.AdamW(param_groups(model, wd), lr=LR, betas=(0.9, 0.999), eps=1e-8)
    nseq, G = (len(tokens) - 1) // T, B * ACCUM
    log = []
    for s in range(STEPS):
        opt.zero_grad()
        ce_sum = aux_sum = z_sum = dropped = 0.0
        for j in range(ACCUM):
            seqs = [(s * G + j * B + b) % nseq for b in range(B)]
            x = torch.tensor(np.stack([tokens[k * T:k * T + T] for k in seqs]), dtype=torch.long)
            y = torch.tensor(np.stack([tokens[k * T + 1:k * T + T + 1] for k in seqs]),
                             dtype=torch.long)
            ce, balance = model(x, y)
            ((ce + balance) / ACCUM).backward()
            ce_sum += ce.item() / ACCUM
            for layer in model.h:
                a, zz, _, d = layer.mlp.last
                aux_sum += layer.mlp.aux * a.mean().item() / ACCUM
                z_sum += layer.mlp.z * zz.mean().item() / ACCUM
                dropped += d
        log.append((ce_sum, aux_sum, z_sum, dropped))
        # An expert that took no token has a zero gradient, as in dtrain's
        # (and Megatron's grouped products'): Adam still moves it by its
        # moments and weight decay, where PyTorch would skip a None.
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        for layer in model.h:
            layer.mlp.end_step()
    return log


def force_router(model, logits):
    """Every token's router logits become `logits`: ln_2 outputs its bias
    alone (weight 0), and the router's rows map that bias to them."""
    with torch.no_grad():
        for layer in model.h:
            v = layer.ln_2.bias
            layer.ln_2.weight.zero_()
            w = torch.tensor(logits).unsqueeze(1) * v.unsqueeze(0) / (v @ v)
            layer.mlp.router.weight.copy_(w)


def run_case(dtrain, tmp, name, E, K, Fw, cf, aux, z, logits=None, rate=None):
    rng = np.random.default_rng(sum(map(ord, name)))
    model = MoEGPT(L, H, C, V, MAXT, E, Fw, K, cf, aux, z, rate)
    model.init_random(torch.Generator().manual_seed(int(rng.integers(1 << 30))))
    if logits:
        force_router(model, logits)
    w = os.path.join(tmp, name + ".init.safetensors")
    st_write(w, model.hf_state(), {"n_head": str(H)})
    tokens = rng.integers(0, V, size=T * 9 + 1)
    data = os.path.join(tmp, name + ".bin")
    shard_write(data, tokens)
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".safetensors")
    args = [dtrain, "train", "--init", w, "--data", data, "--val-fraction", "0",
            "--eval-batches", "0", "--batch-size", str(B), "--seq-len", str(T),
            "--grad-accum", str(ACCUM), "--steps", str(STEPS), "--lr", str(LR),
            "--lr-schedule", "constant", "--weight-decay", "0.1", "--grad-clip", "0.5",
            "--shuffle", "0", "--threads", "1", "--log-json", log, "--save-final", final,
            "--moe-router-topk", str(K), "--moe-aux-loss-coeff", str(aux),
            "--moe-z-loss-coeff", str(z)]
    if cf > 0:
        args += ["--moe-expert-capacity-factor", str(cf)]
    if rate is not None:
        args += ["--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", str(rate)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, "%s: dtrain trained" % name)
    if r.returncode != 0:
        print((r.stdout + r.stderr)[-3000:])
        return
    ours = [json.loads(line) for line in open(log) if '"loss"' in line]
    ref = torch_train(model, tokens)
    check(len(ours) == STEPS, "%s: %d steps logged" % (name, len(ours)))
    for key, i, tol in (("loss", 0, 1e-4), ("moe_aux_loss", 1, 1e-4), ("moe_z_loss", 2, 1e-4)):
        worst = max(abs(o[key] - r[i]) / max(abs(r[i]), 1e-12) for o, r in zip(ours, ref))
        check(worst < tol, "%s: %s within %g at every step (worst %.1e; %.5f -> %.5f)"
              % (name, key, tol, worst, ref[0][i], ref[-1][i]))
    drops = [o["moe_dropped"] for o in ours], [r[3] for r in ref]
    check(drops[0] == drops[1], "%s: dropped slots %s, PyTorch %s" % (name, drops[0], drops[1]))
    got, _ = st_read(final)
    want = model.hf_state()
    check(set(got) == set(want), "%s: --save-final names every expert's tensors" % name)
    worst, where = 0.0, ""
    for n, p in want.items():
        if n.endswith("c_attn.bias"):
            # The key bias adds a constant to each row of scores, which
            # softmax ignores: its true gradient is zero and both sides'
            # is rounding noise that Adam scales up to full steps (as in
            # test_gpt_torch.py). It is held to those steps.
            key = slice(C, 2 * C)
            check(n not in got or (got[n][key] - p[key]).abs().max().item() <= 2 * LR * STEPS,
                  "%s: %s key part within 2 lr per step" % (name, n))
            p = torch.cat([p[:C], p[2 * C:]])
            got[n] = torch.cat([got[n][:C], got[n][2 * C:]]) if n in got else None
        e = max_rel_err(got[n], p) if got.get(n) is not None else 1.0
        if e > worst:
            worst, where = e, n
    check(worst < 1e-4, "%s: final weights within 1e-4 (worst %.1e in %s)" % (name, worst, where))
    return ours, ref


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        run_case(dtrain, tmp, "top2", 4, 2, 40, 0.0, 0.01, 0.001)
        run_case(dtrain, tmp, "top1cap", 4, 1, 48, 1.0, 0.05, 0.0)
        run_case(dtrain, tmp, "k_eq_e", 3, 3, 32, 0.0, 0.01, 0.0)
        got = run_case(dtrain, tmp, "forced", 4, 2, 32, 0.0, 0.01, 0.0, [4.0, 1.0, 1.0, -30.0])
        one = run_case(dtrain, tmp, "one", 4, 1, 32, 1.0, 0.01, 0.0, [-30.0, 4.0, -30.0, -30.0])
        if one:
            cap = -(-T // 4)
            want = L * ACCUM * B * (T - cap)
            check(one[0][0]["moe_dropped"] == want, "one: step 1 dropped %d slots, every token "
                  "past the capacity of %d a sequence (%d)" % (one[0][0]["moe_dropped"], cap, want))
        del got
        # Aux-loss-free: no balance loss, a router preferring experts 0 and
        # 1, and a bias step (1.0) larger than the probabilities' gaps: the
        # choice swings to 2 and 3 at step 2 and back (were the bias
        # ignored, the runs would part at step 2). The gaps stay wide, so
        # rounding cannot flip a choice.
        run_case(dtrain, tmp, "bias", 4, 2, 32, 0.0, 0.0, 0.0, [3.0, 2.0, 1.0, 0.0], rate=1.0)
    finish()


if __name__ == "__main__":
    main()
