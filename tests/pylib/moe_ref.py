"""PyTorch oracle of dtrain's mixture of experts, written from the
definitions (not from dtrain's code): GPT-2 with each layer's MLP replaced
by E experts of the same shape and a router.

- logits = x Wr^T (no bias); probs = softmax in fp32; lse = logsumexp.
- top K by probability, ties to the lower expert index (a stable sort);
  their probabilities renormalized to sum to 1.
- capacity factor CF > 0: an expert takes at most ceil(CF T K / E) slots
  of each sequence, the first in position order (token by token, a
  token's choices in rank order); the rest are dropped.
- sequence-wise balance loss: per sequence f_e = E / (K T) x (slots
  choosing e, before drops), P_e = mean over the sequence of probs[e];
  aux = coeff x sum_e f_e P_e, averaged over the sequences.
- z-loss: coeff x the mean over tokens of lse^2.
- expert bias (aux-loss-free): after each step, b_e += rate x
  sign(mean load - load_e), the load counted over the step's batch.
Both are added to the loss that is differentiated; `loss` stays the
cross-entropy alone."""
import math

import torch
import torch.nn.functional as F

from dtrain_ref import causal_attention


def route(probs, K, cf, bias=None):
    """(top_i [B, T, K], weights [B, T, K], keep [B, T, K] bool). A bias
    per expert (aux-loss-free balancing) shifts the choice, not the weights."""
    B, T, E = probs.shape
    score = probs.detach() if bias is None else probs.detach() + bias
    order = torch.argsort(score, dim=-1, descending=True, stable=True)
    top_i = order[..., :K]
    top_p = torch.gather(probs, -1, top_i)
    w = top_p / top_p.sum(-1, keepdim=True)
    keep = torch.ones(B, T, K, dtype=torch.bool)
    if cf > 0:
        cap = max(1, math.ceil(cf * T * K / E - 1e-9))
        for b in range(B):
            taken = [0] * E
            for t in range(T):
                for k in range(K):
                    e = int(top_i[b, t, k])
                    if taken[e] >= cap:
                        keep[b, t, k] = False
                    taken[e] += 1
    return top_i, w, keep


class MoE(torch.nn.Module):
    def __init__(self, C, E, Fw, K, cf=0.0, aux=0.0, z=0.0, rate=None):
        super().__init__()
        self.E, self.K, self.cf, self.aux, self.z = E, K, cf, aux, z
        self.rate = rate
        self.bias = torch.zeros(E) if rate is not None else None
        self.step_load = torch.zeros(E)
        self.router = torch.nn.Linear(C, E, bias=False)
        self.fc = torch.nn.ModuleList([torch.nn.Linear(C, Fw) for _ in range(E)])
        self.proj = torch.nn.ModuleList([torch.nn.Linear(Fw, C) for _ in range(E)])
        self.last = None  # (aux, z, load [E], dropped) of the last forward

    def forward(self, x):
        B, T, C = x.shape
        logits = self.router(x)
        probs = logits.float().softmax(-1)
        lse = torch.logsumexp(logits, -1)
        top_i, w, keep = route(probs, self.K, self.cf, self.bias)
        chosen = F.one_hot(top_i, self.E).sum(2).float()        # [B, T, E], before drops
        f = self.E / (self.K * T) * chosen.sum(1)                # [B, E]
        P = probs.mean(1)                                         # [B, E]
        aux_seq = (f * P).sum(-1)                                 # [B]
        aux = self.aux * aux_seq.mean()
        zl = self.z * (lse ** 2).mean()
        out = torch.zeros_like(x)
        flat_x = x.reshape(B * T, C)
        flat_out = out.view(B * T, C)
        ti, tw, tk = top_i.reshape(-1, self.K), w.reshape(-1, self.K), keep.reshape(-1, self.K)
        load = torch.zeros(self.E)
        for e in range(self.E):
            rows, ks = torch.nonzero((ti == e) & tk, as_tuple=True)
            load[e] = len(rows)
            if len(rows) == 0:
                continue
            y = self.expert(e, flat_x[rows])
            flat_out = flat_out.index_add(0, rows, tw[rows, ks].unsqueeze(1) * y)
        self.last = (aux_seq.detach(), (lse.detach() ** 2), load, int((~keep).sum()))
        self.step_load += load
        return flat_out.view(B, T, C), aux + zl

    def expert(self, e, x):
        """Expert e on its rows: GPT-2's MLP."""
        return self.proj[e](F.gelu(self.fc[e](x), approximate="tanh"))

    def end_step(self):
        if self.bias is not None:
            self.bias += self.rate * torch.sign(self.step_load.mean() - self.step_load)
        self.step_load.zero_()


class Layer(torch.nn.Module):
    def __init__(self, C, H, moe):
        super().__init__()
        self.H = H
        self.ln_1 = torch.nn.LayerNorm(C, eps=1e-5)
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.c_proj = torch.nn.Linear(C, C)
        self.ln_2 = torch.nn.LayerNorm(C, eps=1e-5)
        self.mlp = moe

    def forward(self, x):
        x = x + self.c_proj(causal_attention(self.ln_1(x), self.c_attn, self.H))
        y, balance = self.mlp(self.ln_2(x))
        return x + y, balance


class MoEGPT(torch.nn.Module):
    def __init__(self, L, H, C, V, maxT, E, Fw, K, cf=0.0, aux=0.0, z=0.0, rate=None):
        super().__init__()
        self.wte = torch.nn.Embedding(V, C)
        self.wpe = torch.nn.Embedding(maxT, C)
        self.h = torch.nn.ModuleList([Layer(C, H, MoE(C, E, Fw, K, cf, aux, z, rate))
                                      for _ in range(L)])
        self.ln_f = torch.nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx, targets):
        """(cross-entropy, the balance terms summed over layers)."""
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        balance = 0.0
        for layer in self.h:
            x, b = layer(x)
            balance = balance + b
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1)), balance

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
                                ("mlp.router.weight", b.mlp.router.weight, False)]:
                yield p + name, t, tr
            for e in range(b.mlp.E):
                q = p + "mlp.experts.%d." % e
                yield q + "c_fc.weight", b.mlp.fc[e].weight, True
                yield q + "c_fc.bias", b.mlp.fc[e].bias, False
                yield q + "c_proj.weight", b.mlp.proj[e].weight, True
                yield q + "c_proj.bias", b.mlp.proj[e].bias, False
        yield "ln_f.weight", self.ln_f.weight, False
        yield "ln_f.bias", self.ln_f.bias, False

    def hf_state(self):
        return {n: (p.t() if tr else p).detach().contiguous().clone()
                for n, p, tr in self.hf_items()}

    def init_random(self, gen, scale=0.1):
        with torch.no_grad():
            for name, p, _ in self.hf_items():
                if p.dim() >= 2:
                    p.normal_(0.0, scale, generator=gen)
                elif ".ln_" in name or name.startswith("ln_f"):
                    p.copy_((1.0 if name.endswith("weight") else 0.0) +
                            0.1 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
