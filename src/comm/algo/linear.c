/*
 * Linear gather and scatter: the root exchanges each rank's block with it
 * directly, a batch of operations posted at a time so they proceed
 * together. A gather's blocks flow to the root, a scatter's from it.
 */
#include "comm/algo/algorithms.h"

#define BATCH 32

/* buf: the root's size blocks; mine: this rank's block elsewhere. */
static int root_exchange(dt_comm *c, const void *mine, char *buf, size_t block, int root,
                         int gather)
{
    c->cur_step = gather ? "linear gather" : "linear scatter";
    if (c->rank != root) {
        dt_p2p op = gather ? dt_p2p_send(root, mine, block) : dt_p2p_recv(root, (void *)mine, block);
        int rc = block ? dt_p2p_run(c, &op, 1) : 0;
        c->cur_step = NULL;
        return rc;
    }
    dt_p2p ops[BATCH];
    int n = 0;
    for (int r = 0; r < c->size; r++) {
        char *at = buf + (size_t)r * block;
        if (r != root && block) ops[n++] = gather ? dt_p2p_recv(r, at, block) : dt_p2p_send(r, at, block);
        if (n == BATCH || (r == c->size - 1 && n)) {
            int rc = dt_p2p_run(c, ops, n);
            if (rc < 0) return rc;
            n = 0;
        }
    }
    c->cur_step = NULL;
    return 0;
}

int dt_gather_linear(dt_comm *c, const void *send, void *recv, size_t block, int root)
{
    return root_exchange(c, send, recv, block, root, 1);
}

int dt_scatter_linear(dt_comm *c, const void *send, void *recv, size_t block, int root)
{
    /* Only the root's send is read, and never written. */
    return root_exchange(c, recv, (char *)send, block, root, 0);
}
