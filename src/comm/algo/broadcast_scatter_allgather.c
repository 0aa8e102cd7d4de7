/*
 * Van de Geijn broadcast: the root cuts the message into p blocks and
 * sends block i to the rank i places after it, then a ring all-gather
 * puts every block everywhere. Each rank sends and receives about twice
 * the message instead of the lg p whole copies of a binomial tree, so it
 * wins for large messages. Ranks are taken relative to the root: rank r
 * holds block (r - root) mod p after the scatter, which is the ring's
 * shift. Blocks may be uneven or empty (n < p); empty ones are skipped on
 * both sides.
 */
#include "comm/algo/algorithms.h"

#define SCATTER_BATCH 32 /* the root's sends posted per step */

int dt_broadcast_scatter_allgather(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)send;
    int p = c->size, r = c->rank, vr = dt_mod(r - root, p);
    char *buf = recv;
    if (!n) return 0;
    c->cur_step = "scatter from the root";
    if (vr == 0) {
        dt_p2p ops[SCATTER_BATCH];
        int k = 0;
        for (int i = 1; i < p; i++) {
            size_t len = dt_block_len(n, p, i);
            if (len) ops[k++] = dt_p2p_send(dt_mod(root + i, p), buf + dt_block_off(n, p, i), len);
            if (k == SCATTER_BATCH || (i == p - 1 && k)) {
                int rc = dt_p2p_run(c, ops, k);
                if (rc < 0) return rc;
                k = 0;
            }
        }
    } else if (dt_block_len(n, p, vr)) {
        dt_p2p op = dt_p2p_recv(root, buf + dt_block_off(n, p, vr), dt_block_len(n, p, vr));
        int rc = dt_p2p_run(c, &op, 1);
        if (rc < 0) return rc;
    }
    dt_group g = dt_group_all(c);
    int rc = dt_ring_allgather_blocks(c, &g, buf, n, 1, dt_mod(-root, p));
    c->cur_step = NULL;
    return rc;
}
