/*
 * Direct reduce-scatter: every rank sends block j of its input straight to
 * rank j, and each rank sums the p contributions to its block in rank order,
 * as the naive all-reduce does for every element. So the bits of a reduced
 * element do not depend on how the vector was cut into blocks or buckets:
 * a ZeRO run reduce-scattering layer by layer forms exactly what a DDP run
 * all-reducing other buckets with `naive` forms. Each rank sends and
 * receives (p-1)/p of the vector, as the ring does, in one step of p-1
 * concurrent messages instead of p-1 steps; it holds p-1 blocks at once.
 */
#include "comm/algo/algorithms.h"

#define SHIFTS 16 /* peers exchanged with per step (two ops each) */

int dt_reduce_scatter_direct(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    int p = c->size, r = c->rank;
    size_t bytes = n * dt_dtype_size(c->cur.dtype);
    if (!bytes) return 0;
    const char *in = send;
    char *slots = dt_comm_scratch(c, (size_t)p * bytes);
    if (!slots) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %d x %zu bytes", p, bytes);
    /* Our own block is copied too: recv may be that very block (in place). */
    dt_local_copy(c, slots + (size_t)r * bytes, in + (size_t)r * bytes, bytes);
    c->cur_step = "direct exchange";
    for (int s = 1; s < p; s += SHIFTS) {
        dt_p2p ops[2 * SHIFTS];
        int k = 0;
        for (int t = s; t < p && t < s + SHIFTS; t++) {
            int to = dt_mod(r + t, p), from = dt_mod(r - t, p);
            ops[k++] = dt_p2p_send(to, in + (size_t)to * bytes, bytes);
            ops[k++] = dt_p2p_recv(from, slots + (size_t)from * bytes, bytes);
        }
        int rc = dt_p2p_run(c, ops, k);
        if (rc < 0) return rc;
    }
    c->cur_step = "direct reduce";
    if (p == 1) {
        dt_local_copy(c, recv, slots, bytes);
    } else {
        dt_local_reduce(c, recv, slots, slots + bytes, n);
        for (int j = 2; j < p; j++) dt_local_reduce(c, recv, recv, slots + (size_t)j * bytes, n);
    }
    c->cur_step = NULL;
    return 0;
}
