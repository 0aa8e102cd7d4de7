/*
 * Linear gather: the root receives every other rank's block directly, a
 * batch of receives posted at a time so they proceed together.
 */
#include "comm/algorithms.h"

#define BATCH 32

int dt_gather_linear(dt_comm *c, const void *send, void *recv, size_t block, int root)
{
    c->cur_step = "linear gather";
    if (c->rank != root) {
        dt_p2p op = dt_p2p_send(root, send, block);
        int rc = block ? dt_p2p_run(c, &op, 1) : 0;
        c->cur_step = NULL;
        return rc;
    }
    dt_p2p ops[BATCH];
    int n = 0;
    for (int r = 0; r < c->size; r++) {
        if (r != root && block) ops[n++] = dt_p2p_recv(r, (char *)recv + (size_t)r * block, block);
        if (n == BATCH || (r == c->size - 1 && n)) {
            int rc = dt_p2p_run(c, ops, n);
            if (rc < 0) return rc;
            n = 0;
        }
    }
    c->cur_step = NULL;
    return 0;
}
