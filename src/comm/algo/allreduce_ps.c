/*
 * Parameter-server all-reduce: rank 0 receives every rank's vector in
 * rank order, adding each into its own, then sends the sum to all. The
 * server's link carries 2(p-1) vectors: the hot spot that motivates every
 * other algorithm here.
 */
#include "comm/algo/algorithms.h"

#define FANOUT 32 /* sends posted together by the server */

int dt_allreduce_ps(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    size_t bytes = n * dt_dtype_size(c->cur.dtype);
    int rc;
    if (c->rank != 0) {
        c->cur_step = "push to the server";
        dt_p2p push = dt_p2p_send(0, send, bytes);
        if ((rc = dt_p2p_run(c, &push, 1)) < 0) return rc;
        c->cur_step = "pull from the server";
        dt_p2p pull = dt_p2p_recv(0, recv, bytes);
        rc = dt_p2p_run(c, &pull, 1);
        c->cur_step = NULL;
        return rc;
    }
    c->cur_step = "server reduce";
    const void *acc = send;
    for (int r = 1; r < c->size; r++) {
        dt_p2p op = dt_p2p_recv_reduce(r, recv, acc, bytes);
        if ((rc = dt_p2p_run(c, &op, 1)) < 0) return rc;
        acc = recv;
    }
    c->cur_step = "server broadcast";
    dt_p2p ops[FANOUT];
    for (int r = 1; r < c->size; r += FANOUT) {
        int k = 0;
        for (int t = r; t < c->size && k < FANOUT; t++) ops[k++] = dt_p2p_send(t, recv, bytes);
        if ((rc = dt_p2p_run(c, ops, k)) < 0) return rc;
    }
    c->cur_step = NULL;
    return 0;
}
