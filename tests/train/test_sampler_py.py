#!/usr/bin/python3
"""The shuffled order, written out independently: splitmix64 seeded by
mix64(seed ^ mix64(epoch + 0x632BE59BD9B4E019)), Fisher-Yates from the top
with unbiased draws (reject below 2^64 mod n). A resumed run depends on
this order never changing, so the C sampler must match it exactly.

usage: test_sampler_py.py path/to/test_dataset
"""
import subprocess
import sys

M = (1 << 64) - 1


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)


def order(seed, epoch, n):
    state = mix64(seed ^ mix64((epoch + 0x632BE59BD9B4E019) & M))

    def below(k):
        nonlocal state
        threshold = (1 << 64) % k
        while True:
            state = (state + 0x9E3779B97F4A7C15) & M
            r = mix64(state)
            if r >= threshold:
                return r % k

    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = below(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def main():
    binary = sys.argv[1]
    cases = [(0, 0, 1), (0, 0, 10), (42, 0, 100), (42, 1, 100), (M, 7, 33),
             (1234567890123, 3, 1000), (5, 0, 3)]
    for seed, epoch, n in cases:
        out = subprocess.run([binary, "perm", str(seed), str(epoch), str(n)], check=True,
                             capture_output=True, text=True).stdout.split()
        got = [int(x) for x in out]
        want = order(seed, epoch, n)
        assert got == want, f"seed {seed} epoch {epoch} n {n}: {got[:10]} vs {want[:10]}"
    print("sampler order matches the Python reference: ok")


if __name__ == "__main__":
    main()
