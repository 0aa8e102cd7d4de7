/*
 * Binomial-tree reduce: in round k a rank whose k-th bit (relative to the
 * root) is set hands its partial result to the rank 2^k below and drops
 * out; the others fold the child's partial into theirs. The fold order is
 * fixed by the tree, so the result does not depend on timing.
 */
#include <string.h>

#include "comm/algorithms.h"

int dt_reduce_binomial(dt_comm *c, const void *send, void *recv, size_t count, int root)
{
    int p = c->size, vr = dt_mod(c->rank - root, p);
    size_t bytes = count * dt_dtype_size(c->cur.dtype);
    /* The accumulator: recv at the root, scratch elsewhere. Until the first
     * child arrives it is simply our own input. */
    void *acc = c->rank == root ? recv : dt_comm_scratch(c, bytes);
    if (!acc && bytes) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %zu bytes", bytes);
    const void *cur = send;
    c->cur_step = "binomial reduce";
    for (int mask = 1; mask < p; mask <<= 1) {
        int rc;
        if (vr & mask) {
            dt_p2p op = dt_p2p_send(dt_mod(vr - mask + root, p), cur, bytes);
            rc = dt_p2p_run(c, &op, 1);
            c->cur_step = NULL;
            return rc;
        }
        if (vr + mask < p) {
            dt_p2p op = dt_p2p_recv_reduce(dt_mod(vr + mask + root, p), acc, cur, bytes);
            if ((rc = dt_p2p_run(c, &op, 1)) < 0) return rc;
            cur = acc;
        }
    }
    if (cur != acc && bytes) memmove(acc, cur, bytes); /* root with no children (p == 1) */
    c->cur_step = NULL;
    return 0;
}
