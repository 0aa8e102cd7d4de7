"""A block kind added from outside the library (test_block_kind.c's
"scale": y = x + g * norm(x)) works everywhere a built-in one does, with
nothing but its file and its registration.

  test_block_kind.py DTRAIN TEST_BLOCK_KIND

- Its gradients, the attention's and the LayerNorms' in the same layers,
  and the loss, against PyTorch's autograd of the same model (1e-5 of the
  largest value of each tensor).
- Training through the library's trainer (test_block_kind train), 4 steps
  of AdamW on 2 layers with GPT-2's vocabulary of 50257, against one
  process with --grad-accum 2 on the same global batch: DDP and ZeRO-3 at 2
  ranks bit for bit (the project's promise for data parallelism at 2 ranks;
  ZeRO's pieces padded), tensor parallelism over 3 ranks with sequence
  parallelism (vocabulary slices of 16753, 16753 and 16751 rows) within
  1e-5 (its row-parallel sums add in another order), a zb1p pipeline of 2 stages bit for bit with a 1F1B one (its
  split backward runs the kind's weight half) and within 1e-5 of one
  process (the tied embedding's two stages). None of those strategies
  knows the kind exists.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_ref import causal_attention, max_rel_err, st_read, st_write  # noqa: E402
from dtrain_run import rel_err, same_bits, write_words  # noqa: E402

torch.set_num_threads(1)
BLOCKS = "ln_1:layernorm,attn:attention,ln_2:layernorm,gate:scale"


class Layer(torch.nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = torch.nn.LayerNorm(C, eps=1e-5)
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.c_proj = torch.nn.Linear(C, C)
        self.ln_2 = torch.nn.LayerNorm(C, eps=1e-5)
        self.gain = torch.nn.Parameter(torch.ones(C))

    def forward(self, x):
        x = x + self.c_proj(causal_attention(self.ln_1(x), self.c_attn, self.H))
        return x + self.gain * self.ln_2(x)


class Model(torch.nn.Module):
    def __init__(self, L, H, C, V, maxT):
        super().__init__()
        self.wte = torch.nn.Embedding(V, C)
        self.wpe = torch.nn.Embedding(maxT, C)
        self.h = torch.nn.ModuleList([Layer(C, H) for _ in range(L)])
        self.ln_f = torch.nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for layer in self.h:
            x = layer(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def hf_items(self):
        """Hugging Face's names; Conv1D stores [in, out], nn.Linear the transpose."""
        yield "wte.weight", self.wte.weight, False
        yield "wpe.weight", self.wpe.weight, False
        for i, b in enumerate(self.h):
            p = "h.%d." % i
            for name, t, tr in [("ln_1.weight", b.ln_1.weight, False),
                                ("ln_1.bias", b.ln_1.bias, False),
                                ("attn.c_attn.weight", b.c_attn.weight, True),
                                ("attn.c_attn.bias", b.c_attn.bias, False),
                                ("attn.c_proj.weight", b.c_proj.weight, True),
                                ("attn.c_proj.bias", b.c_proj.bias, False),
                                ("ln_2.weight", b.ln_2.weight, False),
                                ("ln_2.bias", b.ln_2.bias, False),
                                ("gate.gain", b.gain, False)]:
                yield p + name, t, tr
        yield "ln_f.weight", self.ln_f.weight, False
        yield "ln_f.bias", self.ln_f.bias, False


def check_gradients(oracle, tmp):
    rng = np.random.default_rng(7)
    L, H, C, V, maxT, B, T = 2, 2, 16, 53, 24, 3, 19
    model = Model(L, H, C, V, maxT)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for _, p, _ in model.hf_items():
            p.copy_((1.0 if p.dim() < 2 else 0.0) + 0.2 * torch.randn(p.shape, generator=gen))
    w = os.path.join(tmp, "w.safetensors")
    st_write(w, {n: (p.t() if tr else p).detach().contiguous() for n, p, tr in model.hf_items()},
             {"n_head": str(H)})
    x = torch.from_numpy(rng.integers(0, V, size=(B, T))).long()
    y = torch.from_numpy(rng.integers(0, V, size=(B, T))).long()
    tok = os.path.join(tmp, "tok.i32")
    np.concatenate([x.numpy().ravel(), y.numpy().ravel()]).astype(np.int32).tofile(tok)
    out = os.path.join(tmp, "grads.safetensors")
    r = subprocess.run([oracle, "oracle", w, tok, out, str(B), str(T), BLOCKS],
                       capture_output=True, text=True)
    check(r.returncode == 0, "oracle ran: %s" % r.stderr.strip())
    if r.returncode != 0:
        return
    loss = model(x, y)
    loss.backward()
    got_loss = float(r.stdout.split()[1])
    check(abs(got_loss - loss.item()) < 1e-5 * abs(loss.item()),
          "loss %.7f, PyTorch %.7f" % (got_loss, loss.item()))
    got, _ = st_read(out)
    for name, p, tr in model.hf_items():
        want = p.grad.t() if tr else p.grad
        e = max_rel_err(got["grad." + name], want)
        check(e < 1e-5, "%s's gradient within 1e-5 of PyTorch's (%.2e)" % (name, e))


def train(launch, kind_bin, tmp, name, ranks, extra):
    log, final = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".safetensors")
    args = ["train", "--blocks", BLOCKS, "--data", os.path.join(tmp, "data.txt"),
            "--n-layer", "2", "--n-head", "6", "--n-embd", "48", "--block-size", "32",
            "--seq-len", "24", "--vocab-size", "50257", "--batch-size", "2", "--steps", "4", "--lr", "3e-3", "--lr-schedule", "constant",
            "--weight-decay", "0.1", "--grad-clip", "1", "--shuffle", "0", "--threads", "1",
            "--eval-every", "0", "--eval-batches", "1", "--log-json", log,
            "--save-final", final] + extra
    cmd = ([launch, "launch", "-n", str(ranks), kind_bin] if ranks > 1 else [kind_bin]) + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, "%s trained" % name)
    if r.returncode != 0:
        print((r.stdout + r.stderr)[-3000:])
        return None
    losses = [float(l.split('"loss":')[1].split(",")[0]) for l in open(log) if '"loss"' in l]
    return losses, st_read(final)[0]


def check_strategies(launch, kind_bin, tmp):
    write_words(os.path.join(tmp, "data.txt"), 3)
    one = train(launch, kind_bin, tmp, "one", 1, ["--grad-accum", "2"])
    ddp = train(launch, kind_bin, tmp, "ddp", 2, [])
    zero3 = train(launch, kind_bin, tmp, "zero3", 2, ["--zero-stage", "3"])
    tp = train(launch, kind_bin, tmp, "tp", 3, ["--tp", "3", "--sequence-parallel",
                                                 "--grad-accum", "2"])
    pp = ["--pp", "2", "--grad-accum", "2"]
    zb = train(launch, kind_bin, tmp, "zb1p", 2, pp + ["--pp-schedule", "zb1p"])
    f1b = train(launch, kind_bin, tmp, "1f1b", 2, pp + ["--pp-schedule", "1f1b"])
    if None in (one, ddp, zero3, tp, zb, f1b):
        return
    check("h.1.gate.gain" in one[1] and one[0][-1] < one[0][0],
          "one process trained the kind's gains (losses %s)" % one[0])
    for name, got in (("DDP", ddp), ("ZeRO-3", zero3)):
        check(got[0] == one[0] and same_bits(got[1], one[1]),
              "%s at 2 ranks: the losses and final weights of one process, bit for bit" % name)
    check(same_bits(zb[1], f1b[1]), "zb1p's final weights are 1f1b's, bit for bit")
    for name, got in (("tp 3 + sp", tp), ("pp 2 zb1p", zb)):
        worst = max(abs(a - b) / b for a, b in zip(got[0], one[0]))
        err, where = rel_err(got[1], one[1], 3e-3, 4)
        check(worst <= 1e-6 and err <= 1e-5, "%s: losses within 1e-6 of one process's (%.1e), "
              "weights within 1e-5 (%.1e, %s)" % (name, worst, err, where))


def main():
    launch, kind_bin = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        check_gradients(kind_bin, tmp)
        check_strategies(launch, kind_bin, tmp)
    finish()


if __name__ == "__main__":
    main()
