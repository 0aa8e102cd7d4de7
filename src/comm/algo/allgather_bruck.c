/*
 * Bruck all-gather: ceil(lg p) rounds for any p, where recursive doubling
 * needs a power of two (or two extra fold steps). Each rank works in a
 * buffer that starts at its own block: in round k (d = 2^k) it sends its
 * first min(d, p - d) blocks to rank r - d and appends as many from rank
 * r + d, so after the round it holds blocks r .. r + 2d - 1 (mod p).
 * A final local rotation puts block (r + i) mod p in its slot. Rank 0's
 * buffer is already in slot order, so it works in recv directly.
 */
#include "comm/algo/algorithms.h"

int dt_allgather_bruck(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)send, (void)root;
    int p = c->size, r = c->rank;
    char *out = recv, *w = out;
    if (!n) return 0;
    if (r) {
        w = dt_comm_scratch(c, (size_t)p * n);
        if (!w) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %zu bytes", (size_t)p * n);
        dt_local_copy(c, w, out + (size_t)r * n, n);
    }
    c->cur_step = "bruck all-gather";
    for (int d = 1; d < p; d *= 2) {
        size_t len = (size_t)(d < p - d ? d : p - d) * n;
        dt_p2p ops[2] = {dt_p2p_send(dt_mod(r - d, p), w, len),
                         dt_p2p_recv(dt_mod(r + d, p), w + (size_t)d * n, len)};
        int rc = dt_p2p_run(c, ops, 2);
        if (rc < 0) return rc;
    }
    if (r) {
        c->cur_step = "bruck rotation";
        /* w[i] is block (r + i) mod p; block r is already in its slot. */
        dt_local_copy(c, out + (size_t)(r + 1) * n, w + n, (size_t)(p - r - 1) * n);
        dt_local_copy(c, out, w + (size_t)(p - r) * n, (size_t)r * n);
    }
    c->cur_step = NULL;
    return 0;
}
