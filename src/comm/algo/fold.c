/*
 * Folding a non-power-of-two rank count into a power of two (MPICH's
 * way, see algorithms.h): ranks q..p-1 hand their input to rank r - q
 * first and take the result back last, so the middle of the algorithm
 * runs on exactly q ranks.
 */
#include "comm/algo/algorithms.h"

int dt_fold_in(dt_comm *c, const void *send, void *acc, size_t bytes)
{
    int p = c->size, r = c->rank, q = dt_pow2_floor(p);
    c->cur_step = "fold extra ranks in";
    if (r >= q) {
        dt_p2p op = dt_p2p_send(r - q, send, bytes);
        int rc = dt_p2p_run(c, &op, 1);
        return rc < 0 ? rc : 1;
    }
    if (r < p - q) {
        dt_p2p op = dt_p2p_recv_reduce(r + q, acc, send, bytes);
        return dt_p2p_run(c, &op, 1);
    }
    dt_local_copy(c, acc, send, bytes);
    return 0;
}

int dt_fold_out(dt_comm *c, void *buf, size_t bytes)
{
    int p = c->size, r = c->rank, q = dt_pow2_floor(p);
    c->cur_step = "fold extra ranks out";
    if (r >= q) {
        dt_p2p op = dt_p2p_recv(r - q, buf, bytes);
        return dt_p2p_run(c, &op, 1);
    }
    if (r < p - q) {
        dt_p2p op = dt_p2p_send(r + q, buf, bytes);
        return dt_p2p_run(c, &op, 1);
    }
    return 0;
}
