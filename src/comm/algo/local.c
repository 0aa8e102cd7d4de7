/*
 * The algorithms' local steps: a copy or a reduction in this rank's own
 * memory, between the steps that move data (algorithms.h). On a dry run's
 * stand-in they are handed to the run (c->dry), which costs or records
 * them, as dt_p2p_run hands it the steps.
 */
#include <string.h>

#include "comm/algo/algorithms.h"
#include "comm/reduce_ops.h"

void dt_local_copy(dt_comm *c, void *dst, const void *src, size_t bytes)
{
    if (c->dry) {
        c->dry->copy(c->dry, c, bytes);
        return;
    }
    if (dst != src && bytes) memmove(dst, src, bytes);
}

void dt_local_reduce(dt_comm *c, void *dst, const void *a, const void *b, size_t n)
{
    if (c->dry) {
        c->dry->reduce(c->dry, c, n);
        return;
    }
    dt_reduce_elems(c->cur.dtype, c->cur.op, dst, a, b, n);
}
