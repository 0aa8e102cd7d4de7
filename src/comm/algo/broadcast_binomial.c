/*
 * Binomial-tree broadcast: in round k every member that has the data sends
 * it 2^k members further (relative to the root), so n members are reached
 * in ceil(lg n) rounds. A member's sends to its children go out together.
 */
#include "comm/algo/algorithms.h"

int dt_binomial_broadcast(dt_comm *c, const dt_group *g, void *buf, size_t bytes, int root)
{
    int p = g->size, vr = dt_mod(g->me - root, p);
    int mask = 1;
    c->cur_step = "binomial broadcast";
    while (mask < p) {
        if (vr & mask) {
            dt_p2p op = dt_p2p_recv(dt_group_peer(g, dt_mod(vr - mask + root, p)), buf, bytes);
            int rc = dt_p2p_run(c, &op, 1);
            if (rc < 0) return rc;
            break;
        }
        mask <<= 1;
    }
    dt_p2p ops[32];
    int n = 0;
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < p) ops[n++] = dt_p2p_send(dt_group_peer(g, dt_mod(vr + mask + root, p)), buf, bytes);
    return dt_p2p_run(c, ops, n);
}

int dt_broadcast_binomial(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)send;
    dt_group g = dt_group_all(c);
    int rc = dt_binomial_broadcast(c, &g, recv, n, root);
    c->cur_step = NULL;
    return rc;
}
