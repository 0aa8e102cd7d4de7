"""The Llama family's model in PyTorch, written from its definitions (not
from dtrain's code), as the oracle for dtrain's `--arch llama`:

- RMSNorm: x / sqrt(mean(x^2) + eps) * weight, no bias;
- rotary embeddings, rotate-half: in each head of D dimensions, dimension
  i < D/2 turns with i + D/2 by the angle p * theta^(-2i/D), p the
  token's position (inverse frequencies and angles in fp32, as Hugging
  Face's LlamaRotaryEmbedding);
- grouped-query attention: NH query heads, KV key/value heads, query head
  h reading key/value head h // (NH / KV); causal softmax(q k^T / sqrt(D));
- SwiGLU MLP: down(silu(gate(x)) * up(x));
- no biases anywhere; the output head untied from the embedding unless
  tie=True; torch.nn.Linear weights [out, in].

With experts (E > 0) each layer's MLP is Mixtral's sparse block: a router
(`gate`, no bias) and E SwiGLU experts w2(silu(w1 x) * w3 x), routed and
balanced as moe_ref.py defines (fp32 softmax, top K renormalized, the
sequence-wise balance loss and the z-loss).

hf_state() names the tensors as Hugging Face's LlamaForCausalLM and
MixtralForCausalLM do.
"""
import math

import torch
import torch.nn.functional as F

from moe_ref import MoE


class RMSNorm(torch.nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(T, D, theta):
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def rotate(x, cos, sin):
    """x [B, H, T, D]; cos, sin [T, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(torch.nn.Module):
    def __init__(self, C, NH, KV, theta):
        super().__init__()
        self.NH, self.KV, self.D, self.theta = NH, KV, C // NH, theta
        self.q_proj = torch.nn.Linear(C, C, bias=False)
        self.k_proj = torch.nn.Linear(C, KV * self.D, bias=False)
        self.v_proj = torch.nn.Linear(C, KV * self.D, bias=False)
        self.o_proj = torch.nn.Linear(C, C, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.NH, self.D).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.KV, self.D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.KV, self.D).transpose(1, 2)
        cos, sin = rope_tables(T, self.D, self.theta)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        group = self.NH // self.KV
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.D)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.o_proj(y)


class MLP(torch.nn.Module):
    def __init__(self, C, Fw):
        super().__init__()
        self.gate_proj = torch.nn.Linear(C, Fw, bias=False)
        self.up_proj = torch.nn.Linear(C, Fw, bias=False)
        self.down_proj = torch.nn.Linear(Fw, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoE(MoE):
    """Mixtral's block_sparse_moe: moe_ref's routing, SwiGLU experts."""

    def __init__(self, C, E, Fw, K, aux, z):
        super().__init__(C, E, Fw, K, 0.0, aux, z)
        del self.fc, self.proj
        self.w1 = torch.nn.ModuleList(torch.nn.Linear(C, Fw, bias=False) for _ in range(E))
        self.w3 = torch.nn.ModuleList(torch.nn.Linear(C, Fw, bias=False) for _ in range(E))
        self.w2 = torch.nn.ModuleList(torch.nn.Linear(Fw, C, bias=False) for _ in range(E))

    def expert(self, e, x):
        return self.w2[e](F.silu(self.w1[e](x)) * self.w3[e](x))


class Layer(torch.nn.Module):
    def __init__(self, C, NH, KV, Fw, theta, eps, moe=None):
        super().__init__()
        self.input_layernorm = RMSNorm(C, eps)
        self.self_attn = Attention(C, NH, KV, theta)
        self.post_attention_layernorm = RMSNorm(C, eps)
        self.mlp = MLP(C, Fw) if moe is None else None
        self.block_sparse_moe = moe

    def forward(self, x):
        """(the output, the balance terms)."""
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        if self.mlp is not None:
            return x + self.mlp(h), 0.0
        y, balance = self.block_sparse_moe(h)
        return x + y, balance


def mixtral_name(name):
    """Hugging Face's name of a parameter: the router is `gate`, expert e's
    w1 is experts.{e}.w1 (ModuleLists name them w1.{e})."""
    parts = name.split(".")
    if "block_sparse_moe" not in parts:
        return name
    i = parts.index("block_sparse_moe")
    rest = parts[i + 1:]
    if rest[0] == "router":
        rest = ["gate"] + rest[1:]
    elif rest[0] in ("w1", "w2", "w3"):
        rest = ["experts", rest[1], rest[0]] + rest[2:]
    return ".".join(parts[:i + 1] + rest)


class Llama(torch.nn.Module):
    def __init__(self, L, NH, KV, C, V, Fw, theta=10000.0, eps=1e-5, tie=False, E=0, K=2,
                 aux=0.0, z=0.0):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(V, C)
        self.layers = torch.nn.ModuleList(
            Layer(C, NH, KV, Fw, theta, eps, SparseMoE(C, E, Fw, K, aux, z) if E else None)
            for _ in range(L))
        self.norm = RMSNorm(C, eps)
        self.tie = tie
        self.lm_head = None if tie else torch.nn.Linear(C, V, bias=False)

    def init_random(self, gen, scale=0.02):
        """Every matrix N(0, scale); norms stay ones (their values are
        free: the test loads them into dtrain)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    p.copy_(torch.randn(p.shape, generator=gen) * scale)
                else:
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))

    def forward(self, idx, targets, balance=False):
        """The cross-entropy, or with balance=True (cross-entropy, the
        experts' balance terms summed over layers)."""
        x, terms = self.embed_tokens(idx), 0.0
        for layer in self.layers:
            x, b = layer(x)
            terms = terms + b
        x = self.norm(x)
        w = self.embed_tokens.weight if self.tie else self.lm_head.weight
        logits = x @ w.t()
        ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        return (ce, terms) if balance else ce

    def hf_state(self):
        out = {}
        for n, p in self.named_parameters():
            name = n if n.startswith("lm_head") else "model." + n
            out[mixtral_name(name)] = p.detach().clone()
        return out
