"""ZeRO's memory against the formulas, on a model of 51M parameters.

  test_zero_memory.py DTRAIN

GPT L16 H8 C512, vocabulary 512, block 16 (Psi = 50,709,504), batch 1 x 16,
one step, at 4 ranks, for DDP and ZeRO stages 1-3 (fp32 AdamW); 4, where
each stage saves most against DDP (2 ranks as well cost 30 s of CI time):
  - the model-state bytes each rank has accounted at the start (parameters,
    gradients, optimizer state, as core/alloc counts them) within 5% of the
    formula: 16 Psi, 8 Psi + 8 Psi/N, 4 Psi + 12 Psi/N, 16 Psi/N;
  - the peak resident set falls from stage to stage, by at least what the
    formula says minus the transient windows the run prints (the
    embeddings' gradients and two layers' during backward, the gathered
    layers), with 5% of DDP's RSS to spare;
  - stage 3 at 4 ranks: at most 35% of DDP's per-rank peak RSS, activations
    aside; and so with --init FILE (the DDP run's final weights),
    whose loading reads only each rank's pieces: its peak RSS within 5% of
    DDP's of the run without it (a whole model read into the window first
    would add 4 Psi, a quarter of DDP's).
The runs are separate processes, so each peak RSS is its own. Sixteen
layers, not fewer: what a rank holds besides the model state (about 175
MiB: the library, the windows, the communication rings) must stay small
beside DDP's 1.2 GiB; at 12 layers ZeRO-3's share came to 34.6%, at the
bound (24 layers gave 26% for 15 s more of the suite).
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pylib"))
from checks import check, finish  # noqa: E402
from dtrain_ref import shard_write  # noqa: E402

MIB = 1048576.0


def run(dtrain, data, n, stage, extra=()):
    args = [dtrain, "train", "--data", data, "--val-fraction", "0", "--n-layer", "16",
            "--n-head", "8", "--n-embd", "512", "--block-size", "16", "--batch-size", "1",
            "--steps", "1", "--threads", "1", "--eval-batches", "0", "--nproc", str(n),
            "--zero-stage", str(stage)] + list(extra)
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        raise SystemExit("dtrain train at %d ranks, stage %d failed" % (n, stage))
    return r.stdout


def table(out, title):
    """The formula's MiB row and the ranks' rows of the table titled title."""
    part = out.split(title, 1)[1]
    lines = part.splitlines()
    formula = [float(x) for x in lines[3].split()[1:]]
    ranks = []
    for l in lines[4:]:
        if not l.strip().startswith("rank "):
            break
        ranks.append(l)
    window = 0.0
    for l in lines[4:12]:
        window += sum(float(x) for x in re.findall(r"at most ([0-9.]+) MiB", l))
    return formula, ranks, window


def cells(row):
    """(MiB, ratio) pairs of a rank's row, and its peak RSS."""
    pairs = [(float(a), float(b)) for a, b in re.findall(r"([0-9.]+) x([0-9.]+)", row)]
    rss = float(re.search(r"peak RSS ([0-9.]+)", row).group(1))
    return pairs, rss


def main():
    dtrain = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        import random
        rng = random.Random(0)
        data = os.path.join(tmp, "tok.bin")
        shard_write(data, [rng.randrange(512) for _ in range(20000)])
        want = {0: "16 Psi", 1: "8 Psi + 8 Psi / N", 2: "4 Psi + 12 Psi / N", 3: "16 Psi / N"}
        weights = os.path.join(tmp, "init.safetensors")
        for n in (4,):
            rss, acts, formula_state, windows = {}, {}, {}, {}
            for stage in range(4):
                what = "%s at %d ranks" % ("DDP" if stage == 0 else "ZeRO-%d" % stage, n)
                out = run(dtrain, data, n, stage,
                          ["--save-final", weights] if stage == 0 else [])
                check(want[stage] in out, "%s: the table gives the formula %s" % (what, want[stage]))
                f, ranks, _ = table(out, "memory per rank at the start")
                check(len(ranks) == n, "%s: a row per rank at the start" % what)
                for row in ranks:
                    pairs, _ = cells(row)
                    state_ratio = pairs[3][1]
                    check(abs(state_ratio - 1) <= 0.05,
                          "%s: accounted model state %.1f MiB is x%.4f of the formula's %.1f" %
                          (what, pairs[3][0], state_ratio, f[3]))
                f, ranks, win = table(out, "peak memory per rank")
                worst = max(cells(row)[1] for row in ranks)
                rss[stage], acts[stage], formula_state[stage], windows[stage] = worst, f[4], f[3], win
                print("%s: peak RSS %.1f MiB, formula's model state %.1f MiB, windows %.1f MiB" %
                      (what, worst, f[3], win))
            for stage in (1, 2, 3):
                saved = rss[0] - rss[stage]
                promised = formula_state[0] - formula_state[stage]
                check(saved >= promised - windows[stage] - 0.05 * rss[0],
                      "ZeRO-%d at %d ranks: peak RSS %.1f MiB below DDP's, the formula promises "
                      "%.1f (windows %.1f)" % (stage, n, saved, promised, windows[stage]))
                check(rss[stage] < rss[stage - 1],
                      "at %d ranks, stage %d's peak RSS below stage %d's" % (n, stage, stage - 1))
            if n == 4:
                share = (rss[3] - acts[3]) / (rss[0] - acts[0])
                check(share <= 0.35, "ZeRO-3 at 4 ranks: %.1f%% of DDP's per-rank RSS, "
                      "activations aside (at most 35%%)" % (100 * share))
                out = run(dtrain, data, n, 3, ["--init", weights])
                _, ranks, _ = table(out, "peak memory per rank")
                init_rss = max(cells(row)[1] for row in ranks)
                check(init_rss <= rss[3] + 0.05 * rss[0],
                      "ZeRO-3 at 4 ranks with --init: peak RSS %.1f MiB, without %.1f MiB "
                      "(DDP's %.1f)" % (init_rss, rss[3], rss[0]))
    finish()


if __name__ == "__main__":
    main()
