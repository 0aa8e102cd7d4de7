/*
 * Pairwise all-to-all: in step s every rank sends to the rank s ahead and
 * receives from the rank s behind, so each step is a permutation and no
 * rank is a hot spot.
 */
#include "comm/algo/algorithms.h"

int dt_alltoall_pairwise(dt_comm *c, const void *send, void *recv, size_t block, int root)
{
    (void)root;
    int p = c->size, r = c->rank;
    if (!block) return 0;
    c->cur_step = "pairwise all-to-all";
    for (int s = 1; s < p; s++) {
        int to = dt_mod(r + s, p), from = dt_mod(r - s, p);
        dt_p2p ops[2] = {dt_p2p_send(to, (const char *)send + (size_t)to * block, block),
                         dt_p2p_recv(from, (char *)recv + (size_t)from * block, block)};
        int rc = dt_p2p_run(c, ops, 2);
        if (rc < 0) return rc;
    }
    c->cur_step = NULL;
    return 0;
}
