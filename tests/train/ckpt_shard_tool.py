#!/usr/bin/python3
"""Helpers of test_ckpt_reshard.sh, written from the format's description
(ckpt/shard.h), not from the C code.

  ckpt_shard_tool.py torch CONSOLIDATED REFERENCE CKPTDIR
      The consolidated file loads in PyTorch with Hugging Face names and
      shapes and equals, bit for bit, the reference weights and the
      tensors reassembled here from the shards' pieces by the manifest.
  ckpt_shard_tool.py edit CKPTDIR WHAT
      Damages the manifest: drop-piece, overlap, wrong-size, other-model.
  ckpt_shard_tool.py nan CKPTDIR
      Writes a NaN into shard 1's first parameter and records the shard's
      new checksum, so that only the value check can find it.

The safetensors package is not installed beside Debian's python3-torch: the
files are parsed by hand (8-byte header length, JSON header, data).
"""
import json
import struct
import sys

import torch

MASK = (1 << 64) - 1
PRIME = 1099511628211


def read_st(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (path, name, t["dtype"])
        a, b = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(t["shape"])
    return header, out, 8 + n


def checksum(b):
    """ckpt/shard.h's fingerprint: FNV-1a over 8-byte words in four lanes."""
    h = [1469598103934665603, 1, 2, 3]
    i = 0
    while i + 32 <= len(b):
        for l in range(4):
            (w,) = struct.unpack_from("<Q", b, i + 8 * l)
            h[l] = ((h[l] ^ w) * PRIME) & MASK
        i += 32
    x = h[0]
    for l in range(1, 4):
        x = ((x ^ h[l]) * PRIME) & MASK
    for c in b[i:]:
        x = ((x ^ c) * PRIME) & MASK
    return ((x ^ len(b)) * PRIME) & MASK


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def cmd_torch(consolidated, reference, ckdir):
    fails = 0
    _, got, _ = read_st(consolidated)
    _, want, _ = read_st(reference)
    man = json.load(open(ckdir + "/manifest.json"))
    pieces = {}
    for s in man["shards"]:
        _, ts, _ = read_st(ckdir + "/" + s["file"])
        for name, lo, hi in s["pieces"]:
            pieces.setdefault(name, []).append((lo, hi, ts["%s@%d" % (name, lo)]))
    if sorted(got) != sorted(want):
        print("FAIL names: %s vs %s" % (sorted(got)[:5], sorted(want)[:5]))
        fails += 1
    for name, w in want.items():
        g = got.get(name)
        if g is None or not same_bits(g, w):
            print("FAIL %s: consolidated differs from the reference" % name)
            fails += 1
            continue
        flat = torch.cat([t for _, _, t in sorted(pieces[name], key=lambda p: p[0])])
        if not same_bits(flat, w.reshape(-1)):
            print("FAIL %s: the shards' pieces differ from the reference" % name)
            fails += 1
    n = sum(t.numel() for t in got.values())
    print("%s torch: %d tensors, %d parameters, equal to the reference and the shards" %
          ("FAIL" if fails else "ok  ", len(got), n))
    return 1 if fails else 0


def save_manifest(ckdir, man):
    json.dump(man, open(ckdir + "/manifest.json", "w"), indent=1)


def cmd_edit(ckdir, what):
    man = json.load(open(ckdir + "/manifest.json"))
    s0 = man["shards"][0]["pieces"]
    if what == "drop-piece":
        del s0[1]
    elif what == "overlap":
        s0[1][1] = 1  # the piece at element 0 now starts at 1 ...
        man["shards"][0]["pieces"].append([s0[1][0], 0, 2])  # ... and another covers [0, 2)
    elif what == "wrong-size":
        # Move the cut between shard 0's last piece and shard 1's first
        # (one tensor split between them) by one element: the pieces still
        # tile the tensor, but shard 0's tensor is one element short.
        last, first = s0[-1], man["shards"][1]["pieces"][0]
        assert last[0] == first[0] and last[2] == first[1], (last, first)
        last[2] += 1
        first[1] += 1
    elif what == "other-model":
        man["state"]["model"]["n_head"] = 4
    else:
        raise SystemExit("unknown edit " + what)
    save_manifest(ckdir, man)
    return 0


def cmd_nan(ckdir):
    man = json.load(open(ckdir + "/manifest.json"))
    s = man["shards"][1]
    path = ckdir + "/" + s["file"]
    header, _, start = read_st(path)
    name, lo, _ = s["pieces"][0]
    a, _ = header["%s@%d" % (name, lo)]["data_offsets"]
    raw = bytearray(open(path, "rb").read())
    raw[start + a:start + a + 4] = struct.pack("<f", float("nan"))
    open(path, "wb").write(raw)
    s["checksum"] = "%016x" % checksum(bytes(raw))
    save_manifest(ckdir, man)
    print("%s@%d" % (name, lo))
    return 0


def main():
    a = sys.argv[1:]
    if a[:1] == ["torch"] and len(a) == 4:
        return cmd_torch(*a[1:])
    if a[:1] == ["edit"] and len(a) == 3:
        return cmd_edit(*a[1:])
    if a[:1] == ["nan"] and len(a) == 2:
        return cmd_nan(a[1])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
