/*
 * Hierarchical all-reduce, for ranks spread over hosts: fast links inside
 * a host, slow ones between. With the same number L of ranks on every
 * host (the usual layout):
 *   1. a ring reduce-scatter inside each host leaves local rank i with
 *      the host's sum of block (i + 1) % L;
 *   2. the ranks holding the same block on every host (one "column" per
 *      local index) all-reduce it round a ring across hosts, so each host
 *      link carries 2(H-1)/H of only 1/L of the vector, and all L columns
 *      use the network at once;
 *   3. a ring all-gather inside each host hands the blocks round.
 * Hosts of unequal size use the leader form instead: reduce to each
 * host's first rank, ring all-reduce among those leaders, broadcast back.
 * Either way every element is summed along one path: the same bits on
 * every rank. On one host it is the ring; with one rank per host, ring
 * across the hosts.
 */
#include <stdlib.h>

#include "comm/algo/algorithms.h"

typedef struct {
    int *local, *column; /* communicator ranks: our host's; our column's (or the leaders) */
    dt_group lg, cg;
    int uniform;
} hier_groups;

/* Hosts are numbered by first appearance; a rank's local index is its
 * position among its host's ranks in rank order. */
static int build_groups(const dt_comm *c, hier_groups *h)
{
    int p = c->size, me = c->rank, hosts = 0;
    for (int r = 0; r < p; r++) /* host numbers are the world's: they may exceed p */
        if (c->host_of[r] >= hosts) hosts = c->host_of[r] + 1;
    h->local = malloc((size_t)p * sizeof *h->local);
    h->column = malloc((size_t)p * sizeof *h->column);
    int *index = malloc((size_t)p * sizeof *index), *count = calloc((size_t)hosts, sizeof *count);
    if (!h->local || !h->column || !index || !count) {
        free(index), free(count);
        return -1;
    }
    for (int r = 0; r < p; r++) index[r] = count[c->host_of[r]]++;
    int L = count[c->host_of[me]], nl = 0, nc = 0;
    h->uniform = 1;
    for (int r = 0; r < p; r++)
        if (count[c->host_of[r]] != L) h->uniform = 0;
    for (int r = 0; r < p; r++) {
        if (c->host_of[r] == c->host_of[me]) {
            if (r == me) h->lg.me = nl;
            h->local[nl++] = r;
        }
        /* A column: same local index; the leader form's: local index 0. */
        int want = h->uniform ? index[me] : 0;
        if (index[r] == want) {
            if (r == me) h->cg.me = nc;
            h->column[nc++] = r;
        }
    }
    h->lg.rank = h->local, h->lg.size = nl;
    h->cg.rank = h->column, h->cg.size = nc;
    free(index), free(count);
    return 0;
}

static int uniform_hier(dt_comm *c, hier_groups *h, const void *send, char *recv, size_t n, size_t esz)
{
    int L = h->lg.size, blk = (h->lg.me + 1) % L;
    int rc = 0;
    if (L > 1)
        rc = dt_ring_reduce_scatter_blocks(c, &h->lg, send, recv, n, esz);
    else
        dt_local_copy(c, recv, send, n * esz);
    char *part = recv + dt_block_off(n, L, blk) * esz;
    size_t len = dt_block_len(n, L, blk);
    if (rc == 0) rc = dt_ring_reduce_scatter_blocks(c, &h->cg, part, part, len, esz);
    if (rc == 0) rc = dt_ring_allgather_blocks(c, &h->cg, part, len, esz, 1);
    if (rc == 0) rc = dt_ring_allgather_blocks(c, &h->lg, recv, n, esz, 1);
    return rc;
}

static int leader_hier(dt_comm *c, hier_groups *h, const void *send, char *recv, size_t n, size_t esz)
{
    int rc = dt_binomial_reduce(c, &h->lg, send, recv, n, 0);
    if (rc == 0 && h->lg.me == 0) {
        rc = dt_ring_reduce_scatter_blocks(c, &h->cg, recv, recv, n, esz);
        if (rc == 0) rc = dt_ring_allgather_blocks(c, &h->cg, recv, n, esz, 1);
    }
    if (rc == 0) rc = dt_binomial_broadcast(c, &h->lg, recv, n * esz, 0);
    return rc;
}

int dt_allreduce_hier(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    hier_groups h = {0};
    if (build_groups(c, &h) < 0) {
        free(h.local), free(h.column);
        return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory");
    }
    size_t esz = dt_dtype_size(c->cur.dtype);
    int rc = h.uniform ? uniform_hier(c, &h, send, recv, n, esz) : leader_hier(c, &h, send, recv, n, esz);
    free(h.local), free(h.column);
    c->cur_step = NULL;
    return rc;
}
