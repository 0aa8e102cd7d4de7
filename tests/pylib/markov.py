"""An order-2 Markov chain over a few byte values, whose entropy rate (the
best loss any model can reach on its text, in nats per token) is computed
exactly: a corpus of known answer for learning tests."""
import numpy as np

ALPHABET = b"abcdef"
K = len(ALPHABET)


def make_chain(rng, order=2):
    """P[a, b, c] = p(c | a, b). Dirichlet(0.4): peaked next-symbol
    distributions, so the entropy rate is well below log K and a model that
    only counts unigrams is far from it. order=1 makes p(c | a, b) depend on
    b alone (a bigram chain, no attention needed to learn it)."""
    if order == 1:
        Q = rng.dirichlet([0.4] * K, size=K)
        return np.ascontiguousarray(np.broadcast_to(Q[None], (K, K, K)))
    return rng.dirichlet([0.4] * K, size=(K, K))


def entropy_rate(P):
    """H = sum_s pi(s) H(P[s]) over pair states s = (a, b), pi stationary."""
    T = np.zeros((K * K, K * K))
    for a in range(K):
        for b in range(K):
            for c in range(K):
                T[a * K + b, b * K + c] = P[a, b, c]
    pi = np.full(K * K, 1.0 / (K * K))
    for _ in range(10000):
        pi = pi @ T
    pi /= pi.sum()
    h = -(P * np.log(np.where(P > 0, P, 1))).sum(axis=2).ravel()
    return float(pi @ h)


def sample(P, n, rng):
    out = np.empty(n, dtype=np.int64)
    out[0], out[1] = rng.integers(K), rng.integers(K)
    u = rng.random(n)
    cdf = np.cumsum(P, axis=2)
    for i in range(2, n):
        out[i] = min(np.searchsorted(cdf[out[i - 2], out[i - 1]], u[i]), K - 1)
    return bytes(ALPHABET[j] for j in out)
