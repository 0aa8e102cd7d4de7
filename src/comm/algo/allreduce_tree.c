/*
 * Tree all-reduce: a binomial reduce to rank 0, then a binomial broadcast
 * from it. 2 lg p messages on the critical path, each the whole vector:
 * a latency algorithm, beaten by the butterfly's lg p except where one
 * rank must hold the result first.
 */
#include "comm/algo/algorithms.h"

int dt_allreduce_tree(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    dt_group g = dt_group_all(c);
    int rc = dt_binomial_reduce(c, &g, send, recv, n, 0);
    if (rc == 0) rc = dt_binomial_broadcast(c, &g, recv, n * dt_dtype_size(c->cur.dtype), 0);
    c->cur_step = NULL;
    return rc;
}
