/*
 * Recursive-doubling all-gather: in round k each rank swaps everything it
 * has with the rank 2^k away, so what it holds doubles; lg p rounds, the
 * fewest messages, for small blocks. Before round k rank r holds the 2^k
 * blocks starting at r with its low k bits cleared.
 *
 * Non-powers of two fold like fold.c: with q the largest power of two
 * <= p, extra rank r >= q first hands its block to rank r - q, the
 * doubling runs among ranks 0..q-1 over "virtual" blocks (virtual block
 * i is real blocks i and i + q, the latter only when < p), and rank
 * i < p - q finally sends the whole result to rank i + q. A range of
 * virtual blocks is two runs of real blocks, [lo, hi) and [lo+q, hi+q)
 * cut at p, so a round is two sends and two receives (empty ones
 * skipped), in the same order on both sides.
 */
#include "comm/algo/algorithms.h"

/* Ops moving virtual blocks [lo, lo + cnt): real runs [lo, lo + cnt) and
 * [lo + q, min(lo + q + cnt, p)). */
static int add_runs(dt_p2p *ops, int k, int send, int peer, char *buf, size_t n, int p, int q,
                    int lo, int cnt)
{
    int hi2 = lo + q + cnt < p ? lo + q + cnt : p;
    size_t len[2] = {(size_t)cnt * n, lo + q < hi2 ? (size_t)(hi2 - lo - q) * n : 0};
    char *at[2] = {buf + (size_t)lo * n, buf + (size_t)(lo + q) * n};
    for (int j = 0; j < 2; j++)
        if (len[j]) ops[k++] = send ? dt_p2p_send(peer, at[j], len[j]) : dt_p2p_recv(peer, at[j], len[j]);
    return k;
}

int dt_allgather_rd(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)send, (void)root;
    int p = c->size, r = c->rank, q = dt_pow2_floor(p);
    char *buf = recv;
    int rc = 0;
    if (!n) return 0;
    if (q < p) {
        c->cur_step = "fold extra ranks in";
        if (r >= q) {
            dt_p2p op = dt_p2p_send(r - q, buf + (size_t)r * n, n);
            rc = dt_p2p_run(c, &op, 1);
        } else if (r < p - q) {
            dt_p2p op = dt_p2p_recv(r + q, buf + (size_t)(r + q) * n, n);
            rc = dt_p2p_run(c, &op, 1);
        }
        if (rc < 0) return rc;
    }
    if (r < q) {
        c->cur_step = "recursive doubling";
        for (int mask = 1; mask < q; mask <<= 1) {
            int partner = r ^ mask;
            dt_p2p ops[4];
            int k = add_runs(ops, 0, 1, partner, buf, n, p, q, r & ~(mask - 1), mask);
            k = add_runs(ops, k, 0, partner, buf, n, p, q, partner & ~(mask - 1), mask);
            rc = dt_p2p_run(c, ops, k);
            if (rc < 0) return rc;
        }
    }
    if (q < p) {
        c->cur_step = "fold extra ranks out";
        if (r >= q) {
            dt_p2p op = dt_p2p_recv(r - q, buf, (size_t)p * n);
            rc = dt_p2p_run(c, &op, 1);
        } else if (r < p - q) {
            dt_p2p op = dt_p2p_send(r + q, buf, (size_t)p * n);
            rc = dt_p2p_run(c, &op, 1);
        }
    }
    c->cur_step = NULL;
    return rc < 0 ? rc : 0;
}
