"""Tokenizer throughput: `dtrain data prepare --tokenizer gpt2` beside npm's
gpt-3-encoder (GPT-2's encoder as the field runs it under node) on the same
text, in one invocation.

  python3 bench/bench_tokenizer.py [--dtrain build/dtrain] [--repeat 3] [--no-install]

The texts: the built-in corpus (Debian's fortunes, 2.6 MB of English, one
document per fortune) and a megabyte of varied text (tests/tokenizer/
varied_text.py: a dozen scripts, emoji, numbers, white space, code). Both
sides encode the same documents one by one and must produce the same
number of tokens (the tests check they are the same tokens). dtrain's
figure is the whole command on one pinned core: reading the vocabulary,
encoding, writing the shards; gpt-3-encoder's is its encode() calls alone,
after its vocabulary is loaded (and after a first pass, so its cache is as
warm as it gets), so the comparison leans its way; js-tiktoken's gpt2 is
timed the same way, for reference. MB/s are of the text's bytes, per
second of the process's own CPU time (so that other load on a shared
machine does not count), best of `repeat` runs; the wall-clock rate is
printed beside it.

Targets (issue 34): dtrain at least 10 MB/s on one core, and at least 5x
gpt-3-encoder.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402

sys.path.insert(0, os.path.join(bc.ROOT, "tests", "tokenizer"))
import varied_text  # noqa: E402

MODULES = os.path.join(bc.ROOT, ".deps", "npm", "node_modules")
SEP = "\n%\n"
FORTUNES = "/usr/share/games/fortunes"

# Encodes the documents of argv TEXT (split at SEP) with ENCODER, twice
# (the first pass loads the lazy parts and fills the caches), and prints
# the second pass's CPU and wall seconds and the token count.
NODE = r"""
const [modules, name, text, sep] = process.argv.slice(1);
const fs = require('fs'), path = require('path');
let encode;
if (name === 'gpt-3-encoder') encode = require(path.join(modules, 'gpt-3-encoder')).encode;
else {
  const {Tiktoken} = require(path.join(modules, 'js-tiktoken', 'dist', 'lite.cjs'));
  const t = new Tiktoken(require(path.join(modules, 'js-tiktoken', 'dist', 'ranks', name + '.cjs')));
  encode = (s) => t.encode(s);
}
const docs = fs.readFileSync(text, 'utf8').split(sep).filter(Boolean);
let result;
for (let pass = 0; pass < 2; pass++) {
  const c0 = process.cpuUsage(), w0 = process.hrtime.bigint();
  let n = 0;
  for (const d of docs) n += encode(d).length + 1;  /* + end of text, as dtrain writes */
  const c = process.cpuUsage(c0), w = Number(process.hrtime.bigint() - w0) / 1e9;
  result = {cpu: (c.user + c.system) / 1e6, wall: w, tokens: n};
}
console.log(JSON.stringify(result));
"""


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default=os.path.join(bc.ROOT, "build", "dtrain"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-install", action="store_true",
                    help="do not run scripts/deps.sh (it installs the npm packages)")
    return ap.parse_args()


def write_texts(tmp):
    """The two texts: (label, path, bytes)."""
    names = sorted(n for n in os.listdir(FORTUNES) if not n.endswith((".dat", ".u8")) and
                   os.path.isfile(os.path.join(FORTUNES, n)))
    fortunes = "".join(open(os.path.join(FORTUNES, n), encoding="utf-8").read() for n in names)
    varied = SEP.join(varied_text.documents(1, 1_000_000, SEP))
    out = []
    for label, text in (("fortunes (English)", fortunes), ("varied (12 scripts)", varied)):
        path = os.path.join(tmp, label.split()[0] + ".txt")
        open(path, "w", encoding="utf-8").write(text)
        out.append((label, path, len(text.encode())))
    return out


def dtrain_run(dtrain, text, out):
    """CPU and wall seconds of one `data prepare` on core 0, and its tokens."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(["taskset", "-c", "0", dtrain, "data", "prepare", "--input", text,
                        "--out", out, "--tokenizer", "gpt2", "--doc-separator", "\\n%\\n",
                        "--val-fraction", "0"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit("dtrain data prepare failed:\n" + r.stdout + r.stderr)
    tokens = int(r.stdout.split(" tokens (tokenizer")[0].rsplit(" ", 1)[1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu": cpu, "wall": wall, "tokens": tokens}


def node_run(name, text):
    r = subprocess.run(["taskset", "-c", "0", "node", "-e", NODE, MODULES, name, text, SEP],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("node %s failed (bash scripts/deps.sh installs it):\n%s" % (name, r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def best(runs):
    return min(runs, key=lambda r: r["cpu"])


def main():
    a = parse_args()
    bc.print_machine(a.dtrain)
    bc.ensure_deps(a.no_install)
    busy = bc.quiet()
    node_version = subprocess.run(["node", "--version"], capture_output=True,
                                  text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, path, nbytes in write_texts(tmp):
            d = best([dtrain_run(a.dtrain, path, os.path.join(tmp, "out")) for _ in range(a.repeat)])
            g = best([node_run("gpt-3-encoder", path) for _ in range(a.repeat)])
            t = best([node_run("gpt2", path) for _ in range(a.repeat)])
            if not d["tokens"] == g["tokens"] == t["tokens"]:
                sys.exit("%s: the token counts differ: dtrain %d, gpt-3-encoder %d, js-tiktoken %d"
                         % (label, d["tokens"], g["tokens"], t["tokens"]))
            rows.append((label, nbytes, d, g, t))
    print("\nGPT-2 BPE on one pinned core, node %s, best of %d; machine %.0f%% busy before; MB/s "
          "of text per CPU-second (per wall-second)\n" % (node_version, a.repeat, 100 * busy))
    print("%-22s %7s %9s  %-18s %-18s %-18s %7s %s" % (
        "text", "MB", "tokens", "dtrain", "gpt-3-encoder", "js-tiktoken gpt2", "ratio",
        "targets (>= 10 MB/s, >= 5x)"))
    for label, nbytes, d, g, t in rows:
        mb = nbytes / 1e6
        rate = lambda r: "%6.1f (%6.1f)" % (mb / r["cpu"], mb / r["wall"])  # noqa: E731
        ratio = g["cpu"] / d["cpu"]
        met = mb / d["cpu"] >= 10 and ratio >= 5
        print("%-22s %7.2f %9d  %-18s %-18s %-18s %6.1fx %s" % (
            label, mb, d["tokens"], rate(d), rate(g), rate(t), ratio, "met" if met else "NOT met"))


if __name__ == "__main__":
    main()
