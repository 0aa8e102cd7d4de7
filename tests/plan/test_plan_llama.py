"""`dtrain plan` for the Llama family, against figures worked out here.

  test_plan_llama.py DTRAIN

Parameters: a layer holds q and o (C x C each), k and v (C x KV D each,
grouped-query attention), SwiGLU's gate, up and down (3 C F) and two
RMSNorm weights (2 C), no biases; the model adds the embeddings (V C), the
final norm (C) and, untied, the head (V C); no position table. So
llama3-1b (tied) holds 1.24 B, llama3-8b 8.03 B and llama3-70b 70.55 B:
the planner's count of a rank holding the whole model is that, to the
parameter.
The model line names the family, its key/value heads, SwiGLU's width and
whether the head is tied.
A pipeline of 2 stages of llama3-8b: the last stage holds its 16 layers,
the final norm and the untied head (V C), no copy of the embeddings
(which only a tied head multiplies by).
Selective recomputation forms the norms' outputs and SwiGLU's activation
again (2 C + F floats a row, read and written at the memory rate), not
GPT-2's 6 C.
Tensor parallelism splits whole groups of query heads with their
key/value head and SwiGLU's width: with 2 key/value heads no layout has
tp 4 or 8, and --tp 4 is refused naming them; a width of 5004 takes no
tp 8.
The family's options on a GPT-2 model are refused naming --arch llama
(exit 2), as `dtrain train` refuses them, not ignored.
llama3-70b on 64 hosts of 8 80 GiB ranks, a batch of 1024: the plan
finishes and has a best layout (its time is docs/plan.md's, not checked
here).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402

PRESETS = {  # L, C, heads, KV heads, F, V, tied
    "llama3-1b": (16, 2048, 32, 8, 8192, 128256, True),
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, False),
    "llama3-70b": (80, 8192, 64, 8, 28672, 128256, False),
}
PUBLISHED = {"llama3-1b": 1.24e9, "llama3-8b": 8.03e9, "llama3-70b": 70.55e9}


def plan(dtrain, args):
    return subprocess.run([dtrain, "plan", "--link-model", "nvlink-ib"] + args,
                          capture_output=True, text=True, timeout=120)


def best(dtrain, args):
    r = plan(dtrain, args + ["--json", "--top", "1"])
    check(r.returncode == 0, "plan %s exits 0 (%s)" % (" ".join(args), r.stderr.strip()[-300:]))
    if r.returncode:
        return None
    d = json.loads(r.stdout)
    check(len(d["best"]) == 1, "plan %s has a best layout" % " ".join(args))
    return d["best"][0] if d["best"] else None


def layer(name):
    L, C, H, KV, F, V, _ = PRESETS[name]
    D = C // H
    return 2 * C * C + 2 * C * KV * D + 3 * C * F + 2 * C


def params(name):
    L, C, _, _, _, V, tied = PRESETS[name]
    return L * layer(name) + C + (1 if tied else 2) * V * C


def whole(name, extra=()):
    """One rank holding the whole model at one micro-batch of 1024."""
    return ["--model", name, "--seq-len", "1024", "--global-batch", "2", "--nodes", "1",
            "--ranks-per-node", "1", "--mem-per-rank", "1000000", "--tp", "1", "--pp", "1",
            "--cp", "1", "--zero-stage", "0", "--micro-batch", "1"] + list(extra)


def parameters(dtrain):
    for name in PRESETS:
        want = params(name)
        check(abs(want - PUBLISHED[name]) <= 0.005e9,
              "%s: %d parameters by hand, published %.2f B" % (name, want, PUBLISHED[name] / 1e9))
        row = best(dtrain, whole(name, ["--recompute", "full"]))
        if row:
            check(row["params_per_rank"] == want, "%s: the plan counts %d parameters, by hand %d"
                  % (name, row["params_per_rank"], want))


def model_line(dtrain):
    for name, (L, C, H, KV, F, V, tied) in PRESETS.items():
        r = plan(dtrain, whole(name))
        line = next((x for x in r.stdout.splitlines() if x.startswith("model")), "")
        want = ("llama, %d layers, %d heads (%d key/value: grouped-query attention), %d embd, "
                "SwiGLU width %d, vocab %d, %s head" % (L, H, KV, C, F, V,
                                                        "tied" if tied else "untied"))
        check(r.returncode == 0 and want in line, "%s: the model line '%s' has '%s'"
              % (name, line, want))


def pipeline(dtrain):
    L, C, _, _, _, V, _ = PRESETS["llama3-8b"]
    args = ["--model", "llama3-8b", "--seq-len", "1024", "--global-batch", "2", "--nodes", "1",
            "--ranks-per-node", "2", "--mem-per-rank", "1000000", "--tp", "1", "--pp", "2",
            "--zero-stage", "0", "--micro-batch", "1", "--recompute", "full",
            "--pp-schedule", "1f1b"]
    row = best(dtrain, args)
    if not row:
        return
    want = L // 2 * layer("llama3-8b") + C + V * C  # the last stage: the logits make it the most
    check(row["params_per_rank"] == want, "llama3-8b pp 2: the last stage holds %d, by hand %d "
          "(16 layers, the final norm and the untied head; %d more is the embeddings' copy)"
          % (row["params_per_rank"], want, V * C))


def selective(dtrain):
    L, C, _, _, F, _, _ = PRESETS["llama3-8b"]
    T, M, rate = 1024, 2, 0.5 * 2.0e12  # nvlink-ib: half the A100's 2.0 TB/s
    rows = {rc: best(dtrain, whole("llama3-8b", ["--recompute", rc])) for rc in
            ("none", "selective")}
    if not all(rows.values()):
        return
    got = rows["selective"]["compute_s"] - rows["none"]["compute_s"]
    want = M * L * 2 * (2 * C + F) * 4 * T / rate
    check(abs(got - want) <= 1e-9 * want, "llama3-8b selective: %.9g s more compute a step, by "
          "hand %.9g (2 C + F floats a row; GPT-2's 6 C would be %.9g)"
          % (got, want, want * 6 * C / (2 * C + F)))


def tensor_split(dtrain):
    cluster = ["--nodes", "1", "--ranks-per-node", "8", "--mem-per-rank", "80",
               "--global-batch", "8", "--seq-len", "1024", "--tflops", "100"]
    for extra, allowed in ((["--model", "llama3-8b", "--n-kv-head", "2"], {1, 2}),
                           (["--model", "llama3-1b", "--ffn-hidden-size", "5004"], {1, 2, 4})):
        r = plan(dtrain, extra + cluster + ["--json", "--top", "1000"])
        check(r.returncode == 0, "%s: exits 0 (%s)" % (" ".join(extra), r.stderr.strip()[-300:]))
        if r.returncode == 0:
            tps = {row["tp"] for row in json.loads(r.stdout)["best"]}
            check(tps and tps <= allowed, "%s: tp %s, of %s" % (" ".join(extra), sorted(tps),
                                                                 sorted(allowed)))
    r = plan(dtrain, ["--model", "llama3-8b", "--n-kv-head", "2", "--tp", "4"] + cluster)
    check(r.returncode == 2 and "2 key/value heads" in r.stderr and "--tp takes 1, 2" in r.stderr,
          "--tp 4 with 2 key/value heads: exit %d, %s" % (r.returncode, r.stderr.strip()))


def bad_input(dtrain):
    cluster = ["--nodes", "1", "--ranks-per-node", "8", "--mem-per-rank", "80",
               "--global-batch", "8", "--tflops", "100"]
    for flag in (["--n-kv-head", "4"], ["--tie-word-embeddings"], ["--ffn-hidden-size", "3072"]):
        r = plan(dtrain, ["--model", "gpt2"] + flag + cluster)
        check(r.returncode == 2 and flag[0] in r.stderr and "--arch llama" in r.stderr,
              "gpt2 with %s: exit %d, %s" % (flag[0], r.returncode, r.stderr.strip()))


def seventy_b(dtrain):
    r = plan(dtrain, ["--model", "llama3-70b", "--nodes", "64", "--ranks-per-node", "8",
                      "--mem-per-rank", "80", "--global-batch", "1024", "--tflops", "400"])
    check(r.returncode == 0, "llama3-70b on 64 x 8: exits 0 (%s)" % r.stderr.strip()[-300:])
    first = next((x for x in r.stdout.splitlines() if x.startswith("   1  tp ")), "")
    check("weighed  11076 layouts" in r.stdout and first,
          "llama3-70b on 64 x 8: 11076 layouts weighed, the best: %s" % first.strip())


def main():
    dtrain = sys.argv[1]
    parameters(dtrain)
    model_line(dtrain)
    pipeline(dtrain)
    selective(dtrain)
    tensor_split(dtrain)
    bad_input(dtrain)
    seventy_b(dtrain)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
