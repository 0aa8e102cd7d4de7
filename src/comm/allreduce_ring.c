/*
 * Ring all-reduce: a reduce-scatter round the ring (p-1 steps, each rank
 * passing one block to its right neighbour and folding in the block from
 * its left), then an all-gather of the reduced blocks (p-1 more steps).
 * Bandwidth-optimal, 2(p-1)/p of the buffer crosses each link. Each
 * block's sum is formed once, by its owner, so every rank ends with the
 * same bits. Out of place, each block is first written by the step that
 * folds the incoming partial into our input, so send is never copied.
 */
#include "comm/algorithms.h"

int dt_allreduce_ring(dt_comm *c, const void *send, void *recv, size_t count)
{
    int p = c->size, r = c->rank;
    int right = dt_mod(r + 1, p), left = dt_mod(r - 1, p);
    size_t esz = dt_dtype_size(c->cur.dtype);
    const char *in_buf = send;
    char *b = recv;

    c->cur_step = "ring reduce-scatter";
    for (int s = 0; s < p - 1; s++) {
        int out = dt_mod(r - s, p), in = dt_mod(r - s - 1, p);
        dt_p2p ops[2];
        int n = 0;
        size_t olen = dt_block_len(count, p, out) * esz, ilen = dt_block_len(count, p, in) * esz;
        size_t ooff = dt_block_off(count, p, out) * esz, ioff = dt_block_off(count, p, in) * esz;
        /* Step 0 sends our own input; later steps forward the partial that
         * the previous step left in recv. */
        if (olen) ops[n++] = dt_p2p_send(right, (s == 0 ? in_buf : b) + ooff, olen);
        if (ilen) ops[n++] = dt_p2p_recv_reduce(left, b + ioff, in_buf + ioff, ilen);
        int rc = dt_p2p_run(c, ops, n);
        if (rc < 0) return rc;
    }
    c->cur_step = "ring all-gather";
    for (int s = 0; s < p - 1; s++) {
        int out = dt_mod(r + 1 - s, p), in = dt_mod(r - s, p);
        dt_p2p ops[2];
        int n = 0;
        size_t olen = dt_block_len(count, p, out) * esz, ilen = dt_block_len(count, p, in) * esz;
        if (olen) ops[n++] = dt_p2p_send(right, b + dt_block_off(count, p, out) * esz, olen);
        if (ilen) ops[n++] = dt_p2p_recv(left, b + dt_block_off(count, p, in) * esz, ilen);
        int rc = dt_p2p_run(c, ops, n);
        if (rc < 0) return rc;
    }
    c->cur_step = NULL;
    return 0;
}
