"""dtrain's GPT against PyTorch (the oracle).

  test_gpt_torch.py CHECK GPT_ORACLE DTRAIN

CHECK is one of:
  grads   random small configurations: logits, loss and every parameter's
          gradient in fp32 within 1e-5 of the largest value of each tensor
  adamw   10 AdamW steps with gradient accumulation, clipping and weight
          decay through `dtrain train`: losses and final weights within 1e-4;
          the weights go in with --init (written here) and come back with
          --save-final (read here)
  adam_sgd  the same with Adam (L2 weight decay) and SGD with momentum
  bf16    --dtype bf16 stays within 2% of fp32's loss at every one of 50 steps
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
from dtrain_ref import GPT, max_rel_err, param_groups, shard_write, st_read, st_write  # noqa: E402

torch.set_num_threads(1)


def random_model(rng, L, H, hs, V, maxT):
    model = GPT(L, H, H * hs, V, maxT)
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    model.init_random(gen, scale=0.1)
    return model


def check_grads(oracle, tmp):
    rng = np.random.default_rng(20240520)
    # (L, H, head size, V, maxT, B, T): odd sizes on purpose.
    configs = [(1, 1, 8, 37, 8, 1, 1), (2, 2, 8, 64, 16, 2, 13), (2, 4, 16, 101, 40, 3, 33),
               (3, 3, 5, 50, 20, 2, 20), (1, 2, 32, 256, 70, 2, 70)]
    for (L, H, hs, V, maxT, B, T) in configs:
        name = "L%d H%d C%d V%d T%d B%d" % (L, H, H * hs, V, T, B)
        model = random_model(rng, L, H, hs, V, maxT)
        w = os.path.join(tmp, "w.safetensors")
        st_write(w, model.hf_state(), {"n_head": str(H)})
        x = torch.from_numpy(rng.integers(0, V, size=(B, T))).long()
        y = torch.from_numpy(rng.integers(0, V, size=(B, T))).long()
        tok = os.path.join(tmp, "tok.i32")
        np.concatenate([x.numpy().ravel(), y.numpy().ravel()]).astype(np.int32).tofile(tok)
        out = os.path.join(tmp, "out.safetensors")
        subprocess.run([oracle, w, tok, out, str(B), str(T)], check=True)
        got, _ = st_read(out)
        extra, _ = st_read(out + ".extra")
        logits, loss = model(x, y)
        loss.backward()
        check(max_rel_err(extra["logits"], logits.detach().view(B * T, V)) < 1e-5,
              "%s logits" % name)
        check(abs(extra["loss"][0].item() - loss.item()) < 1e-5 * max(1.0, abs(loss.item())),
              "%s loss %.7f vs torch %.7f" % (name, extra["loss"][0].item(), loss.item()))
        worst, worst_name = 0.0, ""
        for tname, g in model.hf_state(grads=True).items():
            e = max_rel_err(got["grad." + tname], g)
            if e > worst:
                worst, worst_name = e, tname
        check(worst < 1e-5, "%s gradients (worst %.2e in %s)" % (name, worst, worst_name))


def make_optimizer(kind, model, lr, wd):
    groups = param_groups(model, wd)
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    if kind == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    return torch.optim.SGD(groups, lr=lr, momentum=0.9)


def torch_train(model, tokens, B, T, accum, steps, lr, wd, clip, kind="adamw"):
    """The same run as dtrain's, in PyTorch: step s takes sequences
    s*G .. s*G+G-1 (wrapping), micro-batch j the j-th block of B."""
    opt = make_optimizer(kind, model, lr, wd)
    nseq = (len(tokens) - 1) // T
    G = B * accum
    losses = []
    for s in range(steps):
        opt.zero_grad()
        total = 0.0
        for j in range(accum):
            seqs = [(s * G + j * B + b) % nseq for b in range(B)]
            x = torch.tensor(np.stack([tokens[k * T:k * T + T] for k in seqs]), dtype=torch.long)
            y = torch.tensor(np.stack([tokens[k * T + 1:k * T + T + 1] for k in seqs]),
                             dtype=torch.long)
            _, loss = model(x, y)
            (loss / accum).backward()
            total += loss.item() / accum
        losses.append(total)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return losses


def run_dtrain(dtrain, args):
    r = subprocess.run([dtrain, "train"] + args, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit("dtrain train failed")
    return r


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if '"loss"' in line]


def check_adamw(dtrain, tmp, kind="adamw", lr=3e-3):
    rng = np.random.default_rng(7)
    L, H, hs, V, maxT, B, T, accum, steps = 2, 2, 16, 64, 32, 3, 24, 2, 10
    model = random_model(rng, L, H, hs, V, maxT)
    w = os.path.join(tmp, "init.safetensors")
    st_write(w, model.hf_state(), {"n_head": str(H)})
    # Few tokens, so that the run wraps around the data.
    tokens = rng.integers(0, V, size=T * 9 + 1)
    data = os.path.join(tmp, "data.bin")
    shard_write(data, tokens)
    log, final = os.path.join(tmp, "log.json"), os.path.join(tmp, "final.safetensors")
    run_dtrain(dtrain, ["--init", w, "--data", data, "--val-fraction", "0", "--eval-batches", "0",
                        "--batch-size", str(B), "--seq-len", str(T), "--grad-accum", str(accum),
                        "--steps", str(steps), "--lr", str(lr), "--lr-schedule", "constant",
                        "--weight-decay", "0.1", "--grad-clip", "0.5", "--shuffle", "0",
                        "--optimizer", kind] + (["--momentum", "0.9"] if kind == "sgd" else []) + [
                        "--threads", "1", "--log-json", log, "--save-final", final])
    ours = [e["loss"] for e in read_log(log)]
    ref = torch_train(model, tokens, B, T, accum, steps, lr, 0.1, 0.5, kind)
    check(len(ours) == steps, "dtrain logged %d steps" % len(ours))
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, ref))
    check(worst < 1e-4, "10 %s steps: losses within 1e-4 (worst %.2e; %.5f -> %.5f)"
          % (kind, worst, ref[0], ref[-1]))
    check(ref[-1] < ref[0], "the loss went down (%.4f -> %.4f)" % (ref[0], ref[-1]))
    got, meta = st_read(final)
    worst, worst_name = 0.0, ""
    C = H * hs
    for name, p in model.hf_state().items():
        if name.endswith("c_attn.bias"):
            # The key bias adds a constant to each row of scores, which softmax
            # ignores: its true gradient is zero and what both sides compute is
            # rounding noise, which Adam scales up to full-size steps. It can
            # only be held to those steps (lr per step); the query and value
            # biases are compared exactly.
            key = slice(C, 2 * C)
            check((got[name][key] - p[key]).abs().max().item() <= 2 * lr * steps,
                  "%s key part within 2 lr per step" % name)
            p, g = torch.cat([p[:C], p[2 * C:]]), torch.cat([got[name][:C], got[name][2 * C:]])
        else:
            g = got[name]
        e = max_rel_err(g, p)
        if e > worst:
            worst, worst_name = e, name
    check(worst < 1e-4, "final weights within 1e-4 (worst %.2e in %s)" % (worst, worst_name))
    check(meta is not None and meta.get("n_head") == str(H), "--save-final records n_head")


def check_bf16(dtrain, tmp):
    rng = np.random.default_rng(11)
    V = 256
    text = " ".join(rng.choice(["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran"],
                               size=20000))
    data = os.path.join(tmp, "text.txt")
    with open(data, "w") as f:
        f.write(text)
    common = ["--data", data, "--val-fraction", "0", "--eval-batches", "0", "--n-layer", "2",
              "--n-head", "4", "--n-embd", "128", "--block-size", "64", "--vocab-size", str(V),
              "--batch-size", "8", "--steps", "50", "--lr", "1e-3", "--threads", "1",
              "--shuffle", "0", "--seed", "5"]
    logs = {}
    for dtype in ("fp32", "bf16"):
        log = os.path.join(tmp, dtype + ".json")
        run_dtrain(dtrain, common + ["--dtype", dtype, "--log-json", log])
        logs[dtype] = [e["loss"] for e in read_log(log)]
    rel = [abs(b - a) / a for a, b in zip(logs["fp32"], logs["bf16"])]
    check(len(rel) == 50 and max(rel) < 0.02,
          "bf16 within 2%% of fp32 over 50 steps (worst %.3f%%; fp32 %.3f -> %.3f, bf16 %.3f -> %.3f)"
          % (100 * max(rel), logs["fp32"][0], logs["fp32"][-1], logs["bf16"][0], logs["bf16"][-1]))
    check(logs["fp32"][-1] < logs["fp32"][0] - 1.0, "fp32 learned")
    check(any(a != b for a, b in zip(logs["fp32"], logs["bf16"])), "bf16 really ran in bf16")


def main():
    what, oracle, dtrain = sys.argv[1], sys.argv[2], sys.argv[3]
    with tempfile.TemporaryDirectory() as tmp:
        {"grads": lambda: check_grads(oracle, tmp), "adamw": lambda: check_adamw(dtrain, tmp),
         "adam_sgd": lambda: (check_adamw(dtrain, tmp, "adam"),
                              check_adamw(dtrain, tmp, "sgd", lr=0.1)),
         "bf16": lambda: check_bf16(dtrain, tmp)}[what]()
    finish()


if __name__ == "__main__":
    main()
