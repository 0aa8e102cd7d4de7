/*
 * Pairwise all-to-all-v: in step s every rank sends to the rank s ahead
 * and receives from the rank s behind (as alltoall_pairwise.c), each
 * block its own size. A step waits for its pair only, so at most two
 * messages per rank are in flight: the bandwidth-friendly order, in which
 * no rank is a hot spot.
 */
#include "comm/algo/algorithms.h"

int dt_alltoallv_pairwise(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)n, (void)root;
    int p = c->size, r = c->rank;
    c->cur_step = "pairwise all-to-all-v";
    for (int s = 1; s < p; s++) {
        dt_p2p ops[2] = {dt_alltoallv_op(c, send, dt_mod(r + s, p), 1),
                         dt_alltoallv_op(c, recv, dt_mod(r - s, p), 0)};
        int rc = dt_p2p_run(c, ops, 2);
        if (rc < 0) return rc;
    }
    c->cur_step = NULL;
    return 0;
}
