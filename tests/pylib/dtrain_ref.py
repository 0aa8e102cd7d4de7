"""PyTorch oracle for dtrain's tests: GPT-2 written plainly with torch.nn,
safetensors read and written by hand (Debian has no safetensors package),
model directories as Hugging Face writes them, and llm.c token shards."""
import json
import math
import mmap
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

# ---- safetensors -----------------------------------------------------------

_DTYPES = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2)}


def st_write(path, tensors, metadata=None):
    """tensors: dict name -> torch tensor (f32, f16 or bf16)."""
    header, blobs, offset = {}, [], 0
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def st_read(path):
    """Returns (dict name -> float32 torch tensor, metadata). The fp32
    tensors view a private copy-on-write mapping of the file in place: a
    test reads hundreds of MiB of weights per run, and a copy would touch
    every page of fresh memory (slow where a VM shadows the page tables),
    where the file's pages are already in the page cache. The mapping
    outlives the file's removal."""
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    if len(data) < 8:
        raise ValueError("%s: %d bytes, too short for a safetensors file" % (path, len(data)))
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(bytes(data[8:8 + n]))
    meta = header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        dt, size = _DTYPES[info["dtype"]]
        count = (b - a) // size
        if dt == torch.bfloat16:
            t = torch.frombuffer(data, dtype=torch.int16, count=count, offset=base + a).view(
                torch.bfloat16)
        else:
            t = torch.frombuffer(data, dtype=dt, count=count, offset=base + a)
        out[name] = t.reshape(info["shape"]).float()
    return out, meta


# ---- Hugging Face model directories ------------------------------------------

HF_CONFIG, HF_WEIGHTS, HF_INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"


def hf_shard_name(i, n):
    return "model-%05d-of-%05d.safetensors" % (i + 1, n)


def hf_dir_write(path, tensors, config, shards=1, dtype=None):
    """A model directory as save_pretrained writes it: config.json, and
    model.safetensors (shards 1) or `shards` files of consecutive tensors,
    model-0000i-of-0000n.safetensors, with model.safetensors.index.json
    naming each tensor's file. tensors: name -> tensor, cast to dtype
    (torch.bfloat16, torch.float16) when given."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, HF_CONFIG), "w") as f:
        json.dump(config, f, indent=2)
    if dtype is not None:
        tensors = {k: v.to(dtype) for k, v in tensors.items()}
    if shards == 1:
        st_write(os.path.join(path, HF_WEIGHTS), tensors, {"format": "pt"})
        return
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        st_write(os.path.join(path, hf_shard_name(s, shards)), {k: tensors[k] for k in part},
                 {"format": "pt"})
        for k in part:
            weight_map[k] = hf_shard_name(s, shards)
            total += tensors[k].numel() * tensors[k].element_size()
    with open(os.path.join(path, HF_INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def hf_dir_read(path):
    """A model directory: (name -> float32 tensor, config.json as a dict,
    the index as a dict or None). Every tensor once, wherever it lies."""
    with open(os.path.join(path, HF_CONFIG)) as f:
        config = json.load(f)
    index_path = os.path.join(path, HF_INDEX)
    if not os.path.exists(index_path):
        return st_read(os.path.join(path, HF_WEIGHTS))[0], config, None
    with open(index_path) as f:
        index = json.load(f)
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        part = st_read(os.path.join(path, shard))[0]
        assert not set(part) & set(tensors), "a tensor in two shards"
        tensors.update(part)
    return tensors, config, index


def shard_write(path, tokens):
    """An llm.c token shard: 256 int32 header, then uint16 tokens."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


# ---- the model ---------------------------------------------------------------


def causal_attention(h, c_attn, H):
    """GPT-2's attention of the normed input h [B, T, C] over H heads, up to
    its output projection: q, k, v from c_attn, causal softmax, heads joined."""
    B, T, C = h.shape
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in c_attn(h).split(C, dim=2))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


class Block(torch.nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = torch.nn.LayerNorm(C, eps=1e-5)
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.c_proj = torch.nn.Linear(C, C)
        self.ln_2 = torch.nn.LayerNorm(C, eps=1e-5)
        self.c_fc = torch.nn.Linear(C, 4 * C)
        self.mlp_proj = torch.nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.c_proj(causal_attention(self.ln_1(x), self.c_attn, self.H))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(torch.nn.Module):
    def __init__(self, L, H, C, V, maxT):
        super().__init__()
        self.wte = torch.nn.Embedding(V, C)
        self.wpe = torch.nn.Embedding(maxT, C)
        self.h = torch.nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = torch.nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    # Hugging Face names <-> our parameters. HF's Conv1D stores [in, out],
    # the transpose of nn.Linear's weight.
    def hf_items(self):
        yield "wte.weight", self.wte.weight, False
        yield "wpe.weight", self.wpe.weight, False
        for i, b in enumerate(self.h):
            p = "h.%d." % i
            yield p + "ln_1.weight", b.ln_1.weight, False
            yield p + "ln_1.bias", b.ln_1.bias, False
            yield p + "attn.c_attn.weight", b.c_attn.weight, True
            yield p + "attn.c_attn.bias", b.c_attn.bias, False
            yield p + "attn.c_proj.weight", b.c_proj.weight, True
            yield p + "attn.c_proj.bias", b.c_proj.bias, False
            yield p + "ln_2.weight", b.ln_2.weight, False
            yield p + "ln_2.bias", b.ln_2.bias, False
            yield p + "mlp.c_fc.weight", b.c_fc.weight, True
            yield p + "mlp.c_fc.bias", b.c_fc.bias, False
            yield p + "mlp.c_proj.weight", b.mlp_proj.weight, True
            yield p + "mlp.c_proj.bias", b.mlp_proj.bias, False
        yield "ln_f.weight", self.ln_f.weight, False
        yield "ln_f.bias", self.ln_f.bias, False

    def hf_state(self, grads=False):
        out = {}
        for name, p, transposed in self.hf_items():
            t = p.grad if grads else p.data
            out[name] = (t.t() if transposed else t).contiguous().clone()
        return out

    def load_hf(self, state):
        with torch.no_grad():
            for name, p, transposed in self.hf_items():
                t = state[name]
                p.copy_(t.t() if transposed else t)

    def init_random(self, gen, scale=0.02):
        with torch.no_grad():
            for name, p, _ in self.hf_items():
                if p.dim() >= 2:
                    p.normal_(0.0, scale, generator=gen)
                elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def param_groups(model, wd):
    """AdamW groups as dtrain applies them: decay on tensors of 2+ dims."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def max_rel_err(a, b):
    """max |a - b| relative to the largest |b| of the tensor."""
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)
