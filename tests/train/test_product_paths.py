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
them run every timed product on both paths. A third file puts every class
of the same model at 256 tokens a sequence (512 a micro-batch, so the
weight gradients sum 2 pieces of K) on the kernel measured at 128 in
pieces of 256, and DDP and the accumulation agree again. The runs read the file
without adding to it, and --profile shows the flipped and the pieces'
paths. (That an
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

LINE = re.compile(r"^([01]) ([01]) (\d+) (\d+) (\d+) (sgemm|primitive|sgemm/k256|primitive/k256)"
                  r"( \d+\.\d){2}(( \d+\.\d){2})?$")
SHOWN = {"sgemm": "sgemm", "primitive": "matmul", "sgemm/k256": "sgemm/k256",
         "primitive/k256": "matmul/k256"}


def base(tmp, block=128):
    return ["train", "--data", os.path.join(tmp, "data.txt"), "--val-fraction", "0",
            "--n-layer", "1", "--n-head", "12", "--n-embd", "768", "--block-size", str(block),
            "--lr-schedule", "constant", "--lr", "1e-3", "--weight-decay", "0.1",
            "--shuffle", "0", "--threads", "1"]


def classes(path):
    got = {}
    for line in open(path).read().splitlines():
        m = LINE.match(line)
        check(m is not None, "%s: line %r is not '<tA> <tB> <M> <N> <K> <path> <GF/s> <GF/s> "
              "[<GF/s> <GF/s>]'" % (path, line))
        if m:
            got[tuple(int(x) for x in m.group(1, 2, 3, 4, 5))] = m.group(6)
    return got


def equal_layouts(dtrain, tmp, paths, what, block=128):
    env = {"DTRAIN_MATMUL_PATHS": paths}
    before = open(paths).read()
    runs = {}
    for name, extra in (("ddp", ["--nproc", "2", "--batch-size", "2"]),
                        ("accum", ["--batch-size", "2", "--grad-accum", "2"])):
        log = os.path.join(tmp, "%s-%s.json" % (what, name))
        fin = os.path.join(tmp, "%s-%s.safetensors" % (what, name))
        runs[name] = train_logged(dtrain, base(tmp, block) + extra +
                                  ["--steps", "3", "--log-json", log, "--save-final", fin],
                                  log, fin, env)
    (ld, wd, _), (la, wa, _) = runs["ddp"], runs["accum"]
    check([e["loss"] for e in ld] == [e["loss"] for e in la] and len(ld) == 3,
          "%s: DDP's losses %s equal one process's %s" % (what, [e["loss"] for e in ld],
                                                         [e["loss"] for e in la]))
    check(same_bits(wd, wa), "%s: DDP's final weights hold one process's bits" % what)
    check(open(paths).read() == before, "%s: the runs read the file and added nothing" % what)


def profile_path(dtrain, tmp, paths, block, shape):
    """The path --profile names for the product of this shape."""
    r = run(dtrain, base(tmp, block) + ["--batch-size", "2", "--steps", "2", "--profile"],
            {"DTRAIN_MATMUL_PATHS": paths})
    row = re.search(r"^\s+%d\s+%d\s+%d\s+A\^T B\s+(\S+)" % shape, r.stdout, re.M)
    return row.group(1) if row else None


def measure(dtrain, tmp, name, block):
    """A fresh file measured by one step: its classes and paths."""
    measured = os.path.join(tmp, name)
    r = run(dtrain, base(tmp, block) + ["--batch-size", "2", "--steps", "1"],
            {"DTRAIN_MATMUL_PATHS": measured})
    check(r.returncode == 0, "measuring run: %s" % r.stderr[-2000:])
    return measured, classes(measured), r


def class_size(n):
    """The least 2^k or 3 x 2^(k-1) at or above n (kernels/matmul_paths.h)."""
    p = 1
    while p < n:
        p *= 2
    return p // 4 * 3 if p >= 4 and p // 4 * 3 >= n else p


def classes_at(tokens, c=768):
    """Every product class of the model's block of at least 0.5 GFLOP:
    forward, input gradient and weight gradient of its four layers (Conv1D
    [in, out]), on sgemm and the primitive in pieces of K by turns."""
    got = {}
    for i, (n_in, n_out) in enumerate(((c, 3 * c), (c, c), (c, 4 * c), (4 * c, c))):
        for shape in ((0, 0, tokens, n_out, n_in), (0, 1, tokens, n_in, n_out),
                      (1, 0, n_in, n_out, tokens)):
            if 2.0 * shape[2] * shape[3] * shape[4] >= 5e8:
                key = shape[:2] + tuple(class_size(x) for x in shape[2:])
                got.setdefault(key, ("sgemm/k256", "primitive/k256")[len(got) % 2])
    return got


def write_paths(path, got, change):
    with open(path, "w") as f:
        for k, p in got.items():
            f.write("%d %d %d %d %d %s 1.0 1.0\n" % (k + (change(p),)))


def main():
    dtrain = sys.argv[1]
    tmp = tempfile.mkdtemp()
    write_words(os.path.join(tmp, "data.txt"), 5)
    measured, got, r = measure(dtrain, tmp, "measured.txt", 128)
    note = re.search(r"\(this rank timed (\d+) matrix-product shapes on each path on this CPU, "
                     r"[0-9.]+ s in all so far; the fastest path of each is kept for every run "
                     r"on this host in (\S+)\)", r.stdout)
    check(note is not None and int(note.group(1)) == len(got) and note.group(2) == measured,
          "step 1 says it timed the %d shapes, kept in the file%s"
          % (len(got), "" if note else ": " + r.stdout[-600:]))
    # forward, input gradient and weight gradient of c_attn, c_fc and c_proj
    check(len(got) >= 4, "at least 4 classes timed, got %d: %s" % (len(got), got))
    check(any(k[0] == 1 for k in got), "a weight gradient (A^T B) was timed: %s" % got)

    flipped = os.path.join(tmp, "flipped.txt")
    write_paths(flipped, got, lambda p: "primitive" if p.startswith("sgemm") else "sgemm")
    equal_layouts(dtrain, tmp, measured, "measured paths")
    equal_layouts(dtrain, tmp, flipped, "flipped paths")

    # --profile names the path each shape took: c_fc's weight gradient
    # [768, 3072] += inp^T [768, 256] @ dout [256, 3072] takes the flipped one.
    shown = profile_path(dtrain, tmp, flipped, 128, (768, 3072, 256))
    want = "matmul" if got.get((1, 0, 768, 3072, 256), "").startswith("sgemm") else "sgemm"
    check(shown == want, "--profile's c_fc weight gradient row says %s, want %s" % (shown, want))

    # Pieces of K: 512 tokens a micro-batch, every class on its measured
    # kernel in pieces of 256 (the weight gradients then sum 2 pieces).
    # The classes of the block's four layers at 512 tokens, each on one of
    # the two kernels in pieces, in turn.
    pieces = os.path.join(tmp, "pieces.txt")
    write_paths(pieces, classes_at(512), lambda p: p)
    equal_layouts(dtrain, tmp, pieces, "paths in pieces", 256)
    shown = profile_path(dtrain, tmp, pieces, 256, (768, 3072, 512))
    want = SHOWN[classes_at(512)[(1, 0, 768, 3072, 512)]]
    check(shown == want, "--profile's c_fc weight gradient row at 512 tokens says %s, want %s"
          % (shown, want))

    cache = os.path.join(tmp, "cache")
    r = run(dtrain, base(tmp) + ["--batch-size", "2", "--steps", "1"],
            {"DTRAIN_MATMUL_PATHS": "rule", "DTRAIN_CACHE": cache})
    check(r.returncode == 0 and not os.path.exists(os.path.join(cache, "matmul2")),
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
    files = os.listdir(os.path.join(cache, "matmul2")) if os.path.isdir(
        os.path.join(cache, "matmul2")) else []
    check(r.returncode == 0 and len(files) == 1 and files[0].endswith(".txt"),
          "by default the file is <cache>/matmul2/<cpu>.txt: %s" % files)
    finish()


if __name__ == "__main__":
    main()
