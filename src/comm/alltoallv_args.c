/*
 * The variable all-to-all's arguments (dt_alltoallv), checked before the
 * call is queued: every block must fit the address space, a buffer must
 * be there wherever a count is not zero, the rank must send itself what
 * it receives from itself, and no receive block may overlap another or a
 * send block. The algorithms write each receive block once, in whatever
 * order they meet the peers, and read the send blocks until their last
 * step, so overlapping blocks would give an answer that depends on the
 * schedule: they are refused instead (MPI calls them erroneous).
 */
#include <stdint.h>
#include <stdlib.h>

#include "comm/comm_internal.h"
#include "comm/reduce_ops.h"

/* A non-empty block: bytes [lo, hi) of the address space, and its peer. */
typedef struct {
    uintptr_t lo, hi;
    int peer;
} span;

static int by_start(const void *x, const void *y)
{
    const span *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

static const char *side_name(int send) { return send ? "send" : "recv"; }

/* One side's arrays present, each block within the address space, and a
 * buffer wherever a count is not zero; the largest count into *most, the
 * sum into *total (when given). */
static int check_side(dt_comm *c, const dt_coll_args *a, int send, size_t *most, size_t *total)
{
    const size_t *n = send ? a->v.send_counts : a->v.recv_counts;
    const size_t *d = send ? a->v.send_displs : a->v.recv_displs;
    const void *buf = send ? a->send : a->recv;
    const char *side = side_name(send);
    if (!n || !d)
        return dt_comm_invalid(c, "dt_alltoallv: %s_%s is NULL; it needs one entry per rank "
                               "(%d)", side, n ? "displs" : "counts", c->size);
    size_t esz = dt_dtype_size(a->dtype);
    for (int j = 0; j < c->size; j++) {
        size_t end = d[j] + n[j];
        if (end < d[j] || end > (SIZE_MAX - (uintptr_t)buf) / esz)
            return dt_comm_invalid(c, "dt_alltoallv: the %s block of rank %d (displacement "
                                   "%zu, count %zu elements of %s) overflows the address space",
                                   side, j, d[j], n[j], dt_dtype_name(a->dtype));
        if (n[j] && !buf)
            return dt_comm_invalid(c, "dt_alltoallv: %s buffer is NULL with %s_counts[%d] = %zu",
                                   side, side, j, n[j]);
        if (n[j] > *most) *most = n[j];
        if (total) *total += n[j];
    }
    return 0;
}

/* The non-empty blocks of one side, in address order; returns how many. */
static int spans_of(const dt_comm *c, const dt_coll_args *a, int send, span *out)
{
    size_t esz = dt_dtype_size(a->dtype);
    uintptr_t base = (uintptr_t)(send ? a->send : a->recv);
    int k = 0;
    for (int j = 0; j < c->size; j++) {
        size_t n = dt_coll_v_count(a, j, send);
        if (!n) continue;
        uintptr_t lo = base + dt_coll_v_displ(a, j, send) * esz;
        out[k++] = (span){lo, lo + n * esz, j};
    }
    qsort(out, (size_t)k, sizeof *out, by_start);
    return k;
}

/* The first of the sorted, disjoint spans r[0..nr) that ends past `at`,
 * or nr. */
static int first_ending_after(const span *r, int nr, uintptr_t at)
{
    int lo = 0, hi = nr;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (r[mid].hi > at) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* Receive blocks that overlap each other, or a send block. */
static int check_overlaps(dt_comm *c, const dt_coll_args *a, span *r, span *s)
{
    size_t esz = dt_dtype_size(a->dtype);
    int nr = spans_of(c, a, 0, r);
    for (int i = 1; i < nr; i++)
        if (r[i].lo < r[i - 1].hi)
            return dt_comm_invalid(c, "dt_alltoallv: the receive blocks from rank %d (elements "
                                   "%zu..%zu) and rank %d (elements %zu..%zu) overlap; each peer "
                                   "needs a part of recv of its own", r[i - 1].peer,
                                   a->v.recv_displs[r[i - 1].peer],
                                   (r[i - 1].hi - (uintptr_t)a->recv) / esz - 1, r[i].peer,
                                   a->v.recv_displs[r[i].peer],
                                   (r[i].hi - (uintptr_t)a->recv) / esz - 1);
    int ns = spans_of(c, a, 1, s);
    for (int i = 0; i < ns; i++) {
        int k = first_ending_after(r, nr, s[i].lo);
        if (k < nr && r[k].lo < s[i].hi)
            return dt_comm_invalid(c, "dt_alltoallv: the receive block from rank %d overlaps the "
                                   "send block for rank %d; what is sent and what is received "
                                   "must not share memory", r[k].peer, s[i].peer);
    }
    return 0;
}

int dt_alltoallv_check(dt_comm *c, dt_coll_args *a)
{
    size_t most = 0, received = 0;
    int rc = check_side(c, a, 1, &most, NULL);
    if (rc == 0) rc = check_side(c, a, 0, &most, &received);
    if (rc) return rc;
    int me = c->rank;
    if (a->v.send_counts[me] != a->v.recv_counts[me])
        return dt_comm_invalid(c, "dt_alltoallv: rank %d sends itself %zu elements "
                               "(send_counts[%d]) but expects %zu from itself (recv_counts[%d])",
                               me, a->v.send_counts[me], me, a->v.recv_counts[me], me);
    if (a->send && a->send == a->recv)
        return dt_comm_invalid(c, "dt_alltoallv: send and recv are the same buffer; the "
                               "variable all-to-all has no in-place form: pass a separate "
                               "receive buffer");
    span small[2 * 64], *r = small;
    if (c->size > 64 && !(r = malloc(2 * (size_t)c->size * sizeof *r)))
        return dt_comm_invalid(c, "dt_alltoallv: no memory to check %d ranks' blocks", c->size);
    rc = check_overlaps(c, a, r, r + c->size);
    if (r != small) free(r);
    a->count = most;
    /* The blocks are parts of one output, and the outputs of the host's
     * ranks share its last-level cache: past the cache when together they
     * reach DT_STREAM_MIN (2 ranks, 4 MiB a rank pulled through mappings:
     * 281-297 us instead of 327-367 written through the cache). */
    a->stream_out = (double)received * (double)dt_dtype_size(a->dtype) * c->local_size >=
                    (double)DT_STREAM_MIN;
    return rc;
}
