#!/usr/bin/python3
"""`dtrain data prepare --tokenizer` token for token against the field's
own encoders run by node: npm's gpt-3-encoder (GPT-2's encoder, ported)
and js-tiktoken's gpt2 and cl100k_base. The text: the built-in corpus
(every fortune of Debian's fortunes package, a document each) and a
megabyte of varied text (varied_text.py: a dozen scripts, emoji, every
kind of number and white space, code, contractions), 3.6 MB in all;
gpt-3-encoder, slow, reads a megabyte of it. Then decode(encode(x)) == x
on all of it with both tokenizers, and each code point's class against
node's regex engine.

usage: test_oracle.py DTRAIN TEST_TOKENIZER NODE_MODULES
"""
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "pylib"))
import varied_text  # noqa: E402
from checks import check, finish  # noqa: E402

FORTUNES = "/usr/share/games/fortunes"
SEP = "\n%\n"  # between fortunes in their files, and between documents here
ORACLE = os.path.join(HERE, "oracle.js")


def fortunes():
    """The fortune files' text, in the corpus's order (names in byte order)."""
    out = []
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if name.startswith(".") or name.endswith((".dat", ".u8")) or not os.path.isfile(path):
            continue
        out.append(open(path, encoding="utf-8").read())
    if not out:
        sys.exit("no fortune files in %s: run scripts/deps.sh" % FORTUNES)
    return "".join(out)


def node(modules, *args):
    return subprocess.Popen(["node", ORACLE, modules] + list(args))


def shard(path):
    """The header's magic, version and vocabulary, its tokenizer spec, and
    the tokens."""
    raw = open(path, "rb").read()
    magic, version, n, vocab = struct.unpack("<4i", raw[:16])
    spec = raw[64:1024].split(b"\0")[0].decode()
    width = 4 if magic == 20240801 else 2
    assert len(raw) == 1024 + width * n, path
    return magic, version, vocab, spec, list(struct.unpack("<%d%s" % (n, "I" if width == 4
                                                                       else "H"), raw[1024:]))


def ids(path):
    raw = open(path, "rb").read()
    return list(struct.unpack("<%dI" % (len(raw) // 4), raw))


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return "at token %d: %s against %s" % (i, a[max(0, i - 3):i + 4],
                                                   b[max(0, i - 3):i + 4])
    return "lengths %d and %d" % (len(a), len(b))


def prepare(dtrain, text, out, *tokenizer):
    r = subprocess.run([dtrain, "data", "prepare", "--input", text, "--out", out,
                        "--val-fraction", "0", "--doc-separator", "\\n%\\n"] + list(tokenizer),
                       capture_output=True, text=True)
    check(r.returncode == 0, "dtrain data prepare %s: %s" % (" ".join(tokenizer),
                                                             r.stdout.strip() + r.stderr.strip()))
    return shard(os.path.join(out, "train.bin"))


def main():
    dtrain, test_tokenizer, modules = sys.argv[1:4]
    if not os.path.isdir(os.path.join(modules, "js-tiktoken")):
        sys.exit("%s has no js-tiktoken: run scripts/deps.sh" % modules)
    with tempfile.TemporaryDirectory() as tmp:
        varied = varied_text.documents(1, 1_000_000, SEP)
        everything = fortunes() + SEP + SEP.join(varied)
        small = SEP.join(varied[:len(varied) * 3 // 5]) + SEP + fortunes()[:400_000]
        texts = {"all": os.path.join(tmp, "all.txt"), "small": os.path.join(tmp, "small.txt")}
        open(texts["all"], "w", encoding="utf-8").write(everything)
        open(texts["small"], "w", encoding="utf-8").write(small)
        ranks = os.path.join(tmp, "cl100k_base.tiktoken")
        classes = os.path.join(tmp, "classes.bin")
        subprocess.run(["node", ORACLE, modules, "ranks", "cl100k_base", ranks], check=True)
        jobs = {  # the oracles run while dtrain does
            "g3": node(modules, "encode", "gpt-3-encoder", texts["small"], SEP,
                       os.path.join(tmp, "g3.ids")),
            "gpt2": node(modules, "encode", "gpt2", texts["all"], SEP,
                         os.path.join(tmp, "gpt2.ids")),
            "cl100k": node(modules, "encode", "cl100k_base", texts["all"], SEP,
                           os.path.join(tmp, "cl100k.ids")),
            "classes": node(modules, "classes", classes),
        }
        print("text: %d bytes, of which gpt-3-encoder reads %d" % (
            len(everything.encode()), len(small.encode())), flush=True)
        g2 = prepare(dtrain, texts["all"], os.path.join(tmp, "g2"), "--tokenizer", "gpt2")
        g2_small = prepare(dtrain, texts["small"], os.path.join(tmp, "g2s"), "--tokenizer", "gpt2")
        cl = prepare(dtrain, texts["all"], os.path.join(tmp, "cl"), "--tokenizer", ranks,
                     "--eot-id", "100257")
        for name, job in jobs.items():
            check(job.wait() == 0, "node oracle %s ran" % name)
        check(g2[:4] == (20240520, 1, 50257, "gpt2"), "gpt2 shard: uint16, vocabulary 50257, "
              "tokenizer recorded: %s" % (g2[:4],))
        check(cl[:4] == (20240801, 7, 100258, ranks), "cl100k shard: llm.c's uint32 form, "
              "vocabulary 100258 (end of text 100257): %s" % (cl[:4],))
        for label, got, want in (("gpt-3-encoder", g2_small[4], "g3.ids"),
                                 ("js-tiktoken gpt2", g2[4], "gpt2.ids"),
                                 ("js-tiktoken cl100k_base", cl[4], "cl100k.ids")):
            want = ids(os.path.join(tmp, want))
            check(got == want, "%s: %d tokens, the same: %s" % (
                label, len(want), "yes" if got == want else first_difference(got, want)))
        for spec, eot in (("gpt2", []), (ranks, ["100257"])):
            r = subprocess.run([test_tokenizer, "roundtrip", spec, texts["all"]] + eot,
                               capture_output=True, text=True)
            check(r.returncode == 0, "decode(encode(x)) == x with %s: %s" % (
                spec, (r.stdout + r.stderr).strip()[-2000:]))
        r = subprocess.run([test_tokenizer, "unicode", classes], capture_output=True, text=True)
        check(r.returncode == 0, "every code point's class as node's has it: %s" % (
            (r.stdout + r.stderr).strip()[-2000:]))
    finish()


if __name__ == "__main__":
    main()
