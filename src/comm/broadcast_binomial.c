/*
 * Binomial-tree broadcast: in round k every rank that has the data sends it
 * 2^k ranks further (relative to the root), so p ranks are reached in
 * ceil(lg p) rounds. A rank's sends to its children go out together.
 */
#include "comm/algorithms.h"

int dt_broadcast_binomial(dt_comm *c, void *buf, size_t bytes, int root)
{
    int p = c->size, vr = dt_mod(c->rank - root, p);
    int mask = 1;
    c->cur_step = "binomial broadcast";
    while (mask < p) {
        if (vr & mask) {
            dt_p2p op = dt_p2p_recv(dt_mod(vr - mask + root, p), buf, bytes);
            int rc = dt_p2p_run(c, &op, 1);
            if (rc < 0) return rc;
            break;
        }
        mask <<= 1;
    }
    dt_p2p ops[32];
    int n = 0;
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < p) ops[n++] = dt_p2p_send(dt_mod(vr + mask + root, p), buf, bytes);
    int rc = dt_p2p_run(c, ops, n);
    c->cur_step = NULL;
    return rc;
}
