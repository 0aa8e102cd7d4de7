"""Measured matrix-product paths in training (docs/train.md, "Which path a
product takes").

  test_product_paths.py DTRAIN

A 1-layer model 768 wide (256 tokens a micro-batch, so its products of
0.9-1.2 GFLOP are timed) is trained once with a fresh paths file: the
file then holds one well-formed line per shape class it timed. A second
file holds the same classes with every path flipped. Under each file,
DDP at 2 ranks and one process accumulating the same 2 micro-batches give
the same bits (every logged loss and the final weights): every process
takes the file's path for a shape (sgemm and the primitive give different
bits, so a rank on the other path would show), and the two files between
them run every timed product on both paths. The runs read the file
without adding to it, and --profile shows the flipped paths. (That an
accumulating product is C plus the product formed alone, on either path
and in blocks of rows, is checked on the kernel: kernels.matmul_paths.) DTRAIN_MATMUL_PATHS=rule creates no file; an empty value is
refused.
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_run import run, same_bits, train_logged, write_words  # noqa: E402

LINE = re.compile(r"^([01]) ([01]) (\d+) (\d+) (\d+) (sgemm|primitive) (\d+\.\d) (\d+\.\d)$")


def base(tmp):
    return ["train", "--data", os.path.join(tmp, "data.txt"), "--val-fraction", "0",
            "--n-layer", "1", "--n-head", "12", "--n-embd", "768", "--block-size", "128",
            "--lr-schedule", "constant", "--lr", "1e-3", "--weight-decay", "0.1",
            "--shuffle", "0", "--threads", "1"]


def classes(path):
    got = {}
    for line in open(path).read().splitlines():
        m = LINE.match(line)
        check(m is not None, "%s: line %r is not '<tA> <tB> <M> <N> <K> <path> <GF/s> <GF/s>'"
              % (path, line))
        if m:
            got[tuple(int(x) for x in m.group(1, 2, 3, 4, 5))] = m.group(6)
    return got


def equal_layouts(dtrain, tmp, paths, what):
    env = {"DTRAIN_MATMUL_PATHS": paths}
    before = open(paths).read()
    runs = {}
    for name, extra in (("ddp", ["--nproc", "2", "--batch-size", "2"]),
                        ("accum", ["--batch-size", "2", "--grad-accum", "2"])):
        log = os.path.join(tmp, "%s-%s.json" % (what, name))
        fin = os.path.join(tmp, "%s-%s.safetensors" % (what, name))
        runs[name] = train_logged(dtrain, base(tmp) + extra + ["--steps", "3", "--log-json", log,
                                                               "--save-final", fin], log, fin, env)
    (ld, wd, _), (la, wa, _) = runs["ddp"], runs["accum"]
    check([e["loss"] for e in ld] == [e["loss"] for e in la] and len(ld) == 3,
          "%s: DDP's losses %s equal one process's %s" % (what, [e["loss"] for e in ld],
                                                         [e["loss"] for e in la]))
    check(same_bits(wd, wa), "%s: DDP's final weights hold one process's bits" % what)
    check(open(paths).read() == before, "%s: the runs read the file and added nothing" % what)


def main():
    dtrain = sys.argv[1]
    tmp = tempfile.mkdtemp()
    write_words(os.path.join(tmp, "data.txt"), 5)
    measured = os.path.join(tmp, "measured.txt")
    r = run(dtrain, base(tmp) + ["--batch-size", "2", "--steps", "1"],
            {"DTRAIN_MATMUL_PATHS": measured})
    check(r.returncode == 0, "measuring run: %s" % r.stderr[-2000:])
    got = classes(measured)
    note = re.search(r"\(this rank timed (\d+) matrix-product shapes both ways on this CPU, "
                     r"[0-9.]+ s in all so far; the faster path of each is kept for every run on "
                     r"this host in (\S+)\)", r.stdout)
    check(note is not None and int(note.group(1)) == len(got) and note.group(2) == measured,
          "step 1 says it timed the %d shapes, kept in the file%s"
          % (len(got), "" if note else ": " + r.stdout[-600:]))
    # forward, input gradient and weight gradient of c_attn, c_fc and c_proj
    check(len(got) >= 4, "at least 4 classes timed, got %d: %s" % (len(got), got))
    check(any(k[0] == 1 for k in got), "a weight gradient (A^T B) was timed: %s" % got)

    flipped = os.path.join(tmp, "flipped.txt")
    with open(flipped, "w") as f:
        for k, path in got.items():
            f.write("%d %d %d %d %d %s 1.0 1.0\n" % (k + ("primitive" if path == "sgemm"
                                                          else "sgemm",)))
    equal_layouts(dtrain, tmp, measured, "measured paths")
    equal_layouts(dtrain, tmp, flipped, "flipped paths")

    # --profile names the path each shape took: c_fc's weight gradient
    # [768, 3072] += inp^T [768, 256] @ dout [256, 3072] takes the flipped one.
    r = run(dtrain, base(tmp) + ["--batch-size", "2", "--steps", "2", "--profile"],
            {"DTRAIN_MATMUL_PATHS": flipped})
    row = re.search(r"^\s+768\s+3072\s+256\s+A\^T B\s+(\S+)", r.stdout, re.M)
    want = {"sgemm": "sgemm", "primitive": "matmul"}[
        "primitive" if got.get((1, 0, 768, 3072, 256)) == "sgemm" else "sgemm"]
    check(row is not None and row.group(1) == want,
          "--profile's c_fc weight gradient row says %s, want %s" % (row and row.group(1), want))

    cache = os.path.join(tmp, "cache")
    r = run(dtrain, base(tmp) + ["--batch-size", "2", "--steps", "1"],
            {"DTRAIN_MATMUL_PATHS": "rule", "DTRAIN_CACHE": cache})
    check(r.returncode == 0 and not os.path.exists(os.path.join(cache, "matmul")),
          "DTRAIN_MATMUL_PATHS=rule writes no paths file")
    r = run(dtrain, base(tmp) + ["--batch-size", "2", "--steps", "1"],
            {"DTRAIN_MATMUL_PATHS": "", "DTRAIN_CACHE": cache})
    check(r.returncode != 0 and "DTRAIN_MATMUL_PATHS is empty" in r.stderr,
          "an empty DTRAIN_MATMUL_PATHS is refused: rc %d, %s" % (r.returncode, r.stderr[-300:]))
    for value, says in (("off", "give \"rule\" or a file's path with a '/'"),
                        (tmp, "is not a regular file")):
        r = run(dtrain, base(tmp) + ["--batch-size", "2", "--steps", "1"],
                {"DTRAIN_MATMUL_PATHS": value, "DTRAIN_CACHE": cache})
        check(r.returncode != 0 and says in r.stderr and not os.path.exists("off"),
              "DTRAIN_MATMUL_PATHS=%s is refused: rc %d, %s" % (value, r.returncode,
                                                                r.stderr[-300:]))
    r = run(dtrain, base(tmp) + ["--batch-size", "2", "--steps", "1"], {"DTRAIN_CACHE": cache})
    files = os.listdir(os.path.join(cache, "matmul")) if os.path.isdir(
        os.path.join(cache, "matmul")) else []
    check(r.returncode == 0 and len(files) == 1 and files[0].endswith(".txt"),
          "by default the file is <cache>/matmul/<cpu>.txt: %s" % files)
    finish()


if __name__ == "__main__":
    main()
