/*
 * Binomial-tree reduce: in round k a member whose k-th bit (relative to
 * the root) is set hands its partial result to the member 2^k below and
 * drops out; the others fold the child's partial into theirs. The fold
 * order is fixed by the tree, so the result does not depend on timing.
 */
#include "comm/algo/algorithms.h"

int dt_binomial_reduce(dt_comm *c, const dt_group *g, const void *send, void *recv, size_t count,
                       int root)
{
    int p = g->size, vr = dt_mod(g->me - root, p);
    size_t bytes = count * dt_dtype_size(c->cur.dtype);
    /* The accumulator: recv at the root, scratch elsewhere. Until the first
     * child arrives it is simply our own input. */
    void *acc = g->me == root ? recv : dt_comm_scratch(c, bytes);
    if (!acc && bytes) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %zu bytes", bytes);
    const void *cur = send;
    c->cur_step = "binomial reduce";
    for (int mask = 1; mask < p; mask <<= 1) {
        int rc;
        if (vr & mask) {
            dt_p2p op = dt_p2p_send(dt_group_peer(g, dt_mod(vr - mask + root, p)), cur, bytes);
            return dt_p2p_run(c, &op, 1);
        }
        if (vr + mask < p) {
            dt_p2p op = dt_p2p_recv_reduce(dt_group_peer(g, dt_mod(vr + mask + root, p)), acc, cur, bytes);
            if ((rc = dt_p2p_run(c, &op, 1)) < 0) return rc;
            cur = acc;
        }
    }
    if (cur != acc) dt_local_copy(c, acc, cur, bytes); /* a root without children */
    return 0;
}

int dt_reduce_binomial(dt_comm *c, const void *send, void *recv, size_t count, int root)
{
    dt_group g = dt_group_all(c);
    int rc = dt_binomial_reduce(c, &g, send, recv, count, root);
    c->cur_step = NULL;
    return rc;
}
