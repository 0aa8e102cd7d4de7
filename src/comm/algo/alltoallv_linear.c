/*
 * Linear all-to-all-v: every send and receive posted at once (up to
 * DT_P2P_MAX_OPS / 2 peers a step), so that the messages' latencies
 * overlap and each peer's block moves as soon as both sides are there,
 * in whatever order the ranks arrive: the scatter-style exchange, for
 * small and uneven blocks. Peers are taken in pairwise order (s ahead,
 * s behind), so a rank's k-th step meets the k-th step of every peer it
 * exchanges with, and steps never wait on each other across ranks.
 */
#include "comm/algo/algorithms.h"

#define PEERS_PER_STEP (DT_P2P_MAX_OPS / 2)

int dt_alltoallv_linear(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)n, (void)root;
    int p = c->size, r = c->rank;
    c->cur_step = "linear all-to-all-v";
    for (int s0 = 1; s0 < p; s0 += PEERS_PER_STEP) {
        dt_p2p ops[DT_P2P_MAX_OPS];
        int k = 0;
        for (int s = s0; s < p && s < s0 + PEERS_PER_STEP; s++) {
            ops[k++] = dt_alltoallv_op(c, send, dt_mod(r + s, p), 1);
            ops[k++] = dt_alltoallv_op(c, recv, dt_mod(r - s, p), 0);
        }
        int rc = dt_p2p_run(c, ops, k);
        if (rc < 0) return rc;
    }
    c->cur_step = NULL;
    return 0;
}
