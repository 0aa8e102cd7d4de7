/*
 * Ring all-gather: in step s every rank forwards to its right neighbour the
 * block it received in step s-1 (its own in step 0). p-1 steps, each link
 * carries (p-1)/p of the result.
 */
#include "comm/algorithms.h"

int dt_allgather_ring(dt_comm *c, void *recv, size_t block)
{
    int p = c->size, r = c->rank;
    char *b = recv;
    if (!block) return 0;
    c->cur_step = "ring all-gather";
    for (int s = 0; s < p - 1; s++) {
        int out = dt_mod(r - s, p), in = dt_mod(r - s - 1, p);
        dt_p2p ops[2] = {dt_p2p_send(dt_mod(r + 1, p), b + (size_t)out * block, block),
                         dt_p2p_recv(dt_mod(r - 1, p), b + (size_t)in * block, block)};
        int rc = dt_p2p_run(c, ops, 2);
        if (rc < 0) return rc;
    }
    c->cur_step = NULL;
    return 0;
}
