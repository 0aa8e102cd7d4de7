/*
 * Ring all-reduce: a ring reduce-scatter leaves each rank one complete
 * block, a ring all-gather hands the blocks round. 2(p-1) steps, and
 * 2(p-1)/p of the buffer crosses each link: bandwidth-optimal, which is
 * why it is the default for large messages. Pipelining within a step is
 * the transport's: it moves and reduces a block in pieces as they arrive.
 */
#include "comm/algo/algorithms.h"

int dt_allreduce_ring(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    dt_group g = dt_group_all(c);
    size_t esz = dt_dtype_size(c->cur.dtype);
    int rc = dt_ring_reduce_scatter_blocks(c, &g, send, recv, n, esz);
    if (rc == 0) rc = dt_ring_allgather_blocks(c, &g, recv, n, esz, 1);
    c->cur_step = NULL;
    return rc;
}
