#!/usr/bin/python3
"""safetensors between PyTorch and dtrain, both ways.

The safetensors package is not installed next to Debian's python3-torch,
so the files are written and parsed here by hand, following the format:
8-byte little-endian header length, JSON header, data.

1. torch -> C: tensors of F32, F16, BF16 (with infinities, signed zeros,
   subnormals, NaN) and I64 go into a file whose JSON lists them in another
   order than their data; the C reader must give, bit for bit, the fp32
   values torch's own conversion gives.
2. C -> torch: the file dt_st_write_f32 writes must parse, be 8-aligned,
   carry {"format": "pt"}, and hold the values torch computes.

usage: test_safetensors_torch.py path/to/test_safetensors
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch


def tensor_bytes(t):
    # numpy has no bfloat16: write any 16-bit tensor through its int16 view
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.contiguous().view(torch.int16).numpy().tobytes()
    return t.contiguous().numpy().tobytes()


DTYPE = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
         torch.int64: "I64"}


def write_safetensors(path, tensors, metadata, json_order):
    """Data in the order of `tensors`, header entries in json_order."""
    offsets, data, at = {}, b"", 0
    for name, t in tensors.items():
        b = tensor_bytes(t)
        offsets[name] = [at, at + len(b)]
        data += b
        at += len(b)
    header = {"__metadata__": metadata}
    for name in json_order:
        t = tensors[name]
        header[name] = {"dtype": DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": offsets[name]}
    h = json.dumps(header).encode()
    h += b" " * (-(8 + len(h)) % 8)  # as the safetensors package pads
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def torch_to_c(binary, tmp):
    g = torch.Generator().manual_seed(1234)
    special = [float("inf"), float("-inf"), -0.0, 0.0, float("nan"), 1e-45, 3.4e38]
    f32 = torch.randn(2, 3, 4, generator=g)
    f32.view(-1)[:len(special)] = torch.tensor(special)
    f16 = (torch.randn(64, generator=g) * 1000).half()
    f16[:8] = torch.tensor([6e-8, -6e-8, 1e-5, 65504, float("inf"), -0.0, float("nan"),
                            -65504]).half()
    bf16 = (torch.randn(4, 8, generator=g) * 1e10).bfloat16()
    bf16.view(-1)[:5] = torch.tensor([1e-40, float("-inf"), -0.0, float("nan"),
                                      3e38]).bfloat16()
    tensors = {
        "wte.weight": torch.randn(50, 16, generator=g),
        "f32": f32,
        "f16": f16,
        "bf16": bf16,
        "scalar": torch.tensor(0.75),
        "ids": torch.tensor([-1, 50256, 1 << 40], dtype=torch.int64),
    }
    path = os.path.join(tmp, "torch.safetensors")
    write_safetensors(path, tensors, {"format": "pt", "source": "torch"},
                      ["scalar", "bf16", "ids", "f16", "wte.weight", "f32"])
    expected = os.path.join(tmp, "expected.txt")
    with open(expected, "w") as f:
        for name, t in tensors.items():
            if t.dtype == torch.int64:
                continue
            bits = t.float().contiguous().view(torch.int32).view(-1).tolist()
            f.write(f"{name} {DTYPE[t.dtype]} {t.dim()} {' '.join(map(str, t.shape))}\n")
            f.write(" ".join("%08x" % (b & 0xFFFFFFFF) for b in bits) + "\n")
    subprocess.run([binary, "read-torch", path, expected], check=True)


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0, f"data starts at {8 + n}, not 8-aligned"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    torch_dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    out, end = {}, 0
    entries = sorted((e["data_offsets"], name, e) for name, e in header.items()
                     if name != "__metadata__")
    for (b, e2), name, e in entries:
        assert b == end, f"{name}: starts at {b}, previous ended at {end}"
        end = e2
        dt = torch_dtype[e["dtype"]]
        assert b % torch.tensor([], dtype=dt).element_size() == 0, f"{name} misaligned"
        buf = bytearray(data[b:e2])
        if dt == torch.float32:
            t = torch.frombuffer(buf, dtype=torch.float32)
        else:
            t = torch.frombuffer(buf, dtype=torch.int16).view(dt)
        out[name] = t.reshape(e["shape"])
    assert end == len(data), f"{len(data) - end} bytes after the last tensor"
    return header, out


def c_to_torch(binary, tmp):
    path = os.path.join(tmp, "dtrain.safetensors")
    subprocess.run([binary, "write", path], check=True)
    header, t = read_safetensors(path)
    assert header["__metadata__"] == {"format": "pt"}, header["__metadata__"]
    # data in the given order, 4-byte dtypes before 2-byte ones (alignment)
    names = sorted((e["data_offsets"][0], k) for k, e in header.items() if k != "__metadata__")
    assert [k for _, k in names] == ["h.0.attn.c_attn.weight", "h.0.ln_1.bias", "sin", "scalar",
                                     'caf\u00e9 "q"', "sin_f16", "sin_bf16"], names
    w = (torch.arange(12, dtype=torch.float32) - 6) / 4
    assert torch.equal(t["h.0.attn.c_attn.weight"], w.reshape(3, 4))
    bias = torch.arange(5, dtype=torch.float32) * torch.tensor(0.1, dtype=torch.float32)
    assert torch.equal(t["h.0.ln_1.bias"], bias)
    s = t["sin"]
    assert s.shape == (10, 10, 10)
    ref = torch.sin(torch.arange(1000, dtype=torch.float64)).float().reshape(10, 10, 10)
    assert torch.allclose(s, ref, rtol=0, atol=1e-6), (s - ref).abs().max()
    # the C side rounded sin*100 to f16 and sin*1e5 to bf16: torch must agree bit for bit
    assert t["sin_f16"].dtype == torch.float16 and t["sin_f16"].shape == (100, 10)
    assert torch.equal(t["sin_f16"].view(torch.int16),
                       (s.reshape(100, 10) * 100).half().view(torch.int16))
    assert t["sin_bf16"].dtype == torch.bfloat16 and t["sin_bf16"].shape == (1000,)
    assert torch.equal(t["sin_bf16"].view(torch.int16),
                       (s.reshape(1000) * 1e5).bfloat16().view(torch.int16))
    assert t["scalar"].shape == () and t["scalar"].item() == -2.5
    assert t['caf\u00e9 "q"'].tolist() == [-1.5]


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        torch_to_c(binary, tmp)
        c_to_torch(binary, tmp)
        assert sorted(os.listdir(tmp)) == ["dtrain.safetensors", "expected.txt",
                                           "torch.safetensors"], os.listdir(tmp)
    print("safetensors torch: ok")


if __name__ == "__main__":
    main()
