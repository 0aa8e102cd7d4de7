/*
 * Dissemination barrier: in round k each rank signals the rank 2^k ahead
 * and waits for the one 2^k behind; after ceil(lg p) rounds everyone has
 * heard, indirectly, from everyone. Messages are headers only.
 */
#include "comm/algo/algorithms.h"

int dt_barrier_dissemination(dt_comm *c)
{
    int p = c->size, r = c->rank;
    c->cur_step = "dissemination barrier";
    for (int k = 1; k < p; k <<= 1) {
        dt_p2p ops[2] = {dt_p2p_send(dt_mod(r + k, p), NULL, 0),
                         dt_p2p_recv(dt_mod(r - k, p), NULL, 0)};
        int rc = dt_p2p_run(c, ops, 2);
        if (rc < 0) return rc;
    }
    c->cur_step = NULL;
    return 0;
}
