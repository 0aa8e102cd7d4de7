"""`dtrain plan` for a mixture of experts, against figures worked out here.

  test_plan_moe.py DTRAIN

The presets: mixtral-mini (8 layers of width 512, 8 experts of 1792, top
2, vocab 32000, block 1024) and deepseek-moe-mini (64 experts of 352, top
6) hold the parameters counted by hand: per layer two LayerNorms (4 C),
attention (4 C^2 + 4 C), the router (E C) and E experts of 2 C F + F + C;
then V C + T C + 2 C (within 0.1%: tensors are padded to 64 bytes).
Expert parallelism over N ranks leaves each rank E / N of the experts and
the rest whole.
The exchanges: per moe layer per micro-batch 4 all-to-alls (dispatch and
combine, forward and backward) of B T K C floats a rank, (N - 1) / N of
them to other ranks, the busiest rank taking the skew (--moe-skew, 1.3 by
default) times the mean: 4 L M B T K C 4 bytes (N - 1) / N skew a step.
They cost more when the ep group spans hosts than within one.
Bad input: --ep that does not divide the experts, --ep on a dense model,
a skew below 1: each exits 2 naming what would work.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402

PRESETS = {  # L, C, E, F, K, V, T
    "mixtral-mini": (8, 512, 8, 1792, 2, 32000, 1024),
    "deepseek-moe-mini": (8, 512, 64, 352, 6, 32000, 1024),
}


def plan(dtrain, args):
    return subprocess.run([dtrain, "plan", "--tflops", "100", "--link-model", "nvlink-ib"] + args,
                          capture_output=True, text=True, timeout=120)


def best(dtrain, args):
    r = plan(dtrain, args + ["--json", "--top", "1"])
    check(r.returncode == 0, "plan %s exits 0 (%s)" % (" ".join(args), r.stderr.strip()[-300:]))
    if r.returncode:
        return None
    d = json.loads(r.stdout)
    return d["best"][0] if d["best"] else None


def params(name, ep):
    L, C, E, F, _, V, T = PRESETS[name]
    layer = 4 * C + 4 * C * C + 4 * C + E * C + E // ep * (2 * C * F + F + C)
    return L * layer + V * C + T * C + 2 * C


def pinned(name, ep, nodes=1, per_node=4, skew=None, batch=8):
    args = ["--model", name, "--global-batch", str(batch), "--nodes", str(nodes),
            "--ranks-per-node", str(per_node), "--mem-per-rank", "1000", "--tp", "1",
            "--pp", "1", "--ep", str(ep), "--micro-batch", "1", "--zero-stage", "0",
            "--recompute", "none"]
    return args + (["--moe-skew", str(skew)] if skew else [])


def memory(dtrain):
    for name in PRESETS:
        for ep in (1, 2, 4):
            row = best(dtrain, pinned(name, ep))
            if not row:
                continue
            want = params(name, ep)
            got = row["params_per_rank"]
            check(row["ep"] == ep, "%s: the layout has ep %d (%s)" % (name, ep, row["layout"]))
            check(abs(got - want) <= 1e-3 * want,
                  "%s ep %d: %d parameters a rank, by hand %d" % (name, ep, got, want))


def exchanges(dtrain):
    for name in PRESETS:
        L, C, _, _, K, _, T = PRESETS[name]
        for ep, skew in ((2, None), (4, None), (4, 1.0), (2, 1.5)):
            row = best(dtrain, pinned(name, ep, skew=skew))
            if not row:
                continue
            B, M, s = row["micro_batch"], row["micro_batches"], skew or 1.3
            want = 4 * L * M * B * T * K * C * 4 * (ep - 1) / ep * s
            got = row["ep_bytes_per_step"]
            check(abs(got - want) <= 1e-9 * want,
                  "%s ep %d skew %g: %.6g bytes off the busiest rank a step, by hand %.6g"
                  % (name, ep, s, got, want))
            check(row["ep_s"] > 0 and row["step_s"] >= row["compute_s"] + row["ep_s"],
                  "%s ep %d: the all-to-alls (%.3g s) add to the step (%.3g s)"
                  % (name, ep, row["ep_s"], row["step_s"]))
        dense = best(dtrain, pinned(name, 1))
        if dense:
            check(dense["ep_s"] == 0 and dense["ep_bytes_per_step"] == 0,
                  "%s ep 1: no all-to-alls" % name)
    # the same ep 4 group within a host of 4 and over two hosts of 2
    near = best(dtrain, pinned("mixtral-mini", 4, nodes=1, per_node=4))
    far = best(dtrain, pinned("mixtral-mini", 4, nodes=2, per_node=2))
    if near and far:
        check(far["ep_s"] > 2 * near["ep_s"],
              "ep 4 over two hosts (%.3g s) costs more than within one (%.3g s)"
              % (far["ep_s"], near["ep_s"]))
        check(far["ep_bytes_per_step"] == near["ep_bytes_per_step"],
              "the same bytes either way")


def unpinned(dtrain):
    r = plan(dtrain, ["--model", "mixtral-mini", "--global-batch", "64", "--nodes", "2",
                      "--ranks-per-node", "4", "--mem-per-rank", "16", "--json", "--top", "1000", "--cp", "1"])
    check(r.returncode == 0, "an unpinned plan of mixtral-mini on 8 ranks exits 0 (%s)"
          % r.stderr.strip()[-300:])
    if r.returncode:
        return
    rows = json.loads(r.stdout)["best"]
    eps = sorted({w["ep"] for w in rows})
    check(eps == [1, 2, 4, 8], "with cp 1 pinned (fewer layouts), it weighs ep 1, 2, 4 and 8 "
          "(saw %s)" % eps)
    check(all(w["dp"] % w["ep"] == 0 for w in rows), "ep divides dp in each")


def bad_input(dtrain):
    base = ["--global-batch", "8", "--nodes", "1", "--ranks-per-node", "4", "--mem-per-rank",
            "100"]
    cases = [
        (["--model", "mixtral-mini", "--ep", "3"], ["--ep 3", "8 experts", "1, 2, 4"]),
        (["--model", "gpt2", "--ep", "2"], ["--ep 2", "--num-experts"]),
        (["--model", "mixtral-mini", "--moe-skew", "0.5"], ["--moe-skew", "at least 1"]),
    ]
    for args, words in cases:
        r = plan(dtrain, base + args)
        check(r.returncode == 2 and all(w in r.stderr for w in words),
              "plan %s exits 2 naming %s (rc %d: %s)" % (" ".join(args), words, r.returncode,
                                                        r.stderr.strip()[-300:]))


def dry_run(dtrain):
    for name, (L, C, E, F, K, V, T) in PRESETS.items():
        r = subprocess.run([dtrain, "train", "--model", name, "--dry-run"], capture_output=True,
                           text=True, timeout=120)
        want = params(name, 1)
        got = [int(w.split("=")[1].split()[0]) for w in r.stdout.split(",") if "Psi = " in w]
        check(r.returncode == 0 and got and abs(got[0] - want) <= 1e-3 * want,
              "train --model %s --dry-run: Psi %s, by hand %d (%s)"
              % (name, got, want, r.stderr.strip()[-200:]))


def main():
    dtrain = sys.argv[1]
    memory(dtrain)
    exchanges(dtrain)
    unpinned(dtrain)
    bad_input(dtrain)
    dry_run(dtrain)
    finish()


if __name__ == "__main__":
    main()
