#!/usr/bin/python3
"""The default corpus, built from the installed fortunes package into a
fresh DTRAIN_CACHE, against a reconstruction written here from the format's
description: the plain fortune files in byte order of their names, each
'%' line an empty line, every file ending in a newline; the last 10% of
the bytes (rounded) for validation. Skipped when the package is missing.

usage: test_corpus_py.py path/to/test_corpus
"""
import os
import struct
import subprocess
import sys
import tempfile

SRC = b"/usr/share/games/fortunes"


def expected_text():
    out = bytearray()
    for name in sorted(os.listdir(SRC)):
        path = os.path.join(SRC, name)
        if name.startswith(b".") or name.endswith((b".dat", b".u8")) or not os.path.isfile(path):
            continue
        lines = open(path, "rb").read().split(b"\n")
        for i, line in enumerate(lines):
            if i == len(lines) - 1 and line == b"":
                break  # what follows the final newline
            out += (b"" if line == b"%" else line) + b"\n"
    return bytes(out)


def shard_tokens(path):
    raw = open(path, "rb").read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    assert (magic, version) == (20240520, 1), (magic, version)
    assert len(raw) == 1024 + 2 * n
    tokens = struct.unpack(f"<{n}H", raw[1024:])
    assert max(tokens) < 256
    return bytes(tokens)


def run(binary, cache):
    p = subprocess.run([binary, "default", cache], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.split("\n")[:2], p.stderr


def main():
    if not os.path.isdir(SRC):
        print("fortunes package not installed: skipped")
        sys.exit(77)
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as cache:
        (train, val), err = run(binary, cache)
        assert train == os.path.join(cache, "fortunes", "train.bin"), train
        assert val == os.path.join(cache, "fortunes", "val.bin"), val
        assert "built the default corpus" in err and "/usr/share/games/fortunes" in err, err
        text = expected_text()
        got_train, got_val = shard_tokens(train), shard_tokens(val)
        assert got_train + got_val == text, "corpus differs from the package's text"
        assert len(got_val) == int(len(text) * 0.1 + 0.5), (len(got_val), len(text))
        assert b"%\n" not in text[:200] and len(text) > 1_000_000
        (train2, val2), err2 = run(binary, cache)
        assert (train2, val2) == (train, val) and err2 == "", "second use rebuilt: " + err2
        assert sorted(os.listdir(os.path.join(cache, "fortunes"))) == ["train.bin", "val.bin"]
    print(f"default corpus: {len(text)} bytes, ok")


if __name__ == "__main__":
    main()
