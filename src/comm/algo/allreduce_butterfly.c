/*
 * Butterfly (recursive doubling) all-reduce: in round k each rank swaps
 * its whole partial result with the rank 2^k away and both combine them.
 * lg p rounds: the fewest messages of any all-reduce, so it wins for small
 * messages, but every round moves the whole vector. Partners compute
 * a op b and b op a, equal bits for commutative ops. Two buffers take
 * turns (the one being sent is never the one being written); the parity
 * of the round count decides where to start so the last round lands in
 * recv. Non-powers of two fold in and out (fold.c).
 */
#include "comm/algo/algorithms.h"

int dt_allreduce_butterfly(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    size_t bytes = n * dt_dtype_size(c->cur.dtype);
    int p = c->size, q = dt_pow2_floor(p), rounds = 0;
    while ((1 << rounds) < q) rounds++;
    char *bufs[2] = {recv, dt_comm_scratch(c, bytes)};
    if (!bufs[1] && bytes) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %zu bytes", bytes);
    /* Write k (k = 1..rounds) goes to bufs[(rounds - k) % 2], so the last
     * lands in recv. Round 1 reads our input directly unless a fold
     * partner's input must be added first, or it would write over it. */
    const char *cur = send;
    int has_partner = c->rank < p - q || c->rank >= q;
    if (has_partner || (send == recv && rounds % 2 == 1)) {
        int rc = dt_fold_in(c, send, bufs[rounds % 2], bytes);
        if (rc < 0) return rc;
        if (rc == 1) rounds = 0; /* an extra rank: it waits for the result */
        cur = bufs[rounds % 2];
    }
    c->cur_step = "butterfly exchange";
    for (int k = 1, mask = 1; k <= rounds; k++, mask <<= 1) {
        char *dst = bufs[(rounds - k) % 2];
        int partner = c->rank ^ mask;
        dt_p2p ops[2] = {dt_p2p_send(partner, cur, bytes), dt_p2p_recv_reduce(partner, dst, cur, bytes)};
        int rc = dt_p2p_run(c, ops, 2);
        if (rc < 0) return rc;
        cur = dst;
    }
    int rc = dt_fold_out(c, recv, bytes);
    c->cur_step = NULL;
    return rc;
}
