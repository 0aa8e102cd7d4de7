/*
 * Ring reduce-scatter: the partial sum of block b travels round the ring,
 * each rank folding in its own input of that block, and arrives complete at
 * rank b after p-1 steps. Partials live in two scratch blocks (the one
 * going out, the one coming in), so the input is only read.
 */
#include "comm/algo/algorithms.h"

static int overlaps(const char *a, size_t alen, const char *b, size_t blen)
{
    return a < b + blen && b < a + alen;
}

int dt_reduce_scatter_ring(dt_comm *c, const void *send, void *recv, size_t count, int root)
{
    (void)root;
    int p = c->size, r = c->rank;
    size_t bytes = count * dt_dtype_size(c->cur.dtype);
    const char *in = send;
    if (!bytes) return 0;
    char *tmp = dt_comm_scratch(c, 3 * bytes);
    if (!tmp) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %zu bytes", 3 * bytes);
    /* The last step may write straight into recv unless recv overlaps an
     * input block other than the one it reads. */
    char *own = (char *)in + (size_t)r * bytes;
    int direct = recv == own || !overlaps(recv, bytes, in, (size_t)p * bytes);
    c->cur_step = "ring reduce-scatter";
    const char *outgoing = in + (size_t)dt_mod(r - 1, p) * bytes;
    for (int s = 0; s < p - 1; s++) {
        int blk = dt_mod(r - s - 2, p);
        int last = s == p - 2;
        char *dst = last && direct ? (char *)recv : tmp + (size_t)(s % 2) * bytes;
        if (last && !direct) dst = tmp + 2 * bytes;
        dt_p2p ops[2] = {dt_p2p_send(dt_mod(r + 1, p), outgoing, bytes),
                         dt_p2p_recv_reduce(dt_mod(r - 1, p), dst, in + (size_t)blk * bytes,
                                            bytes)};
        int rc = dt_p2p_run(c, ops, 2);
        if (rc < 0) return rc;
        outgoing = dst;
    }
    if (!direct) dt_local_copy(c, recv, tmp + 2 * bytes, bytes);
    c->cur_step = NULL;
    return 0;
}
