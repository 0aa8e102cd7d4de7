/*
 * Naive all-reduce: every rank sends its whole vector to every other rank,
 * then reduces all p vectors itself, in rank order, so every rank forms
 * the same bits. (p-1) vectors in and out of every rank and (p-1) of them
 * held at once: the baseline the others improve on.
 */
#include "comm/algo/algorithms.h"

#define SHIFTS 16 /* peers exchanged with per step (two ops each) */

int dt_allreduce_naive(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    int p = c->size, r = c->rank;
    size_t bytes = n * dt_dtype_size(c->cur.dtype);
    /* One slot per rank; ours holds a copy only in place, where recv is
     * about to be overwritten. */
    char *slots = dt_comm_scratch(c, (size_t)p * bytes);
    if (!slots && bytes) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %d x %zu bytes", p, bytes);
    const char *own = send;
    if (send == recv) {
        dt_local_copy(c, slots + (size_t)r * bytes, send, bytes);
        own = slots + (size_t)r * bytes;
    }
    c->cur_step = "naive exchange";
    for (int s = 1; s < p; s += SHIFTS) {
        dt_p2p ops[2 * SHIFTS];
        int k = 0;
        for (int t = s; t < p && t < s + SHIFTS; t++) {
            int from = dt_mod(r - t, p);
            ops[k++] = dt_p2p_send(dt_mod(r + t, p), send, bytes);
            ops[k++] = dt_p2p_recv(from, slots + (size_t)from * bytes, bytes);
        }
        int rc = dt_p2p_run(c, ops, k);
        if (rc < 0) return rc;
    }
    c->cur_step = "naive reduce";
#define SRC(j) ((j) == r ? own : slots + (size_t)(j) * bytes)
    dt_local_reduce(c, recv, SRC(0), SRC(1), n);
    for (int j = 2; j < p; j++) dt_local_reduce(c, recv, recv, SRC(j), n);
#undef SRC
    c->cur_step = NULL;
    return 0;
}
