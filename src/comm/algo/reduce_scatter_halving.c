/*
 * Recursive-halving reduce-scatter: in round k (mask = q/2, q/4, .., 1)
 * partners mask apart split the blocks they are still responsible for,
 * each sends the half the other keeps and reduces the half it keeps; lg p
 * rounds of halving size, (p-1)/p of the input per rank like ring, with
 * far fewer messages. Rank r ends owning block r; every block is reduced
 * along one tree, in one place.
 *
 * Non-powers of two fold: with q the largest power of two <= p, extra
 * rank r >= q sends its whole input to rank r - q, which reduces it into
 * its own; halving runs among ranks 0..q-1 over "virtual" blocks (virtual
 * block i is real blocks i and i + q, the latter only when < p), so a
 * range of virtual blocks is two runs of real blocks; at the end rank i
 * sends block i + q's sum to rank i + q.
 *
 * Partials live in scratch (p blocks, at their input offsets): the input
 * is only read, since recv may overlap it. The first round reads the
 * input (or, after a fold, the scratch); the last writes block r straight
 * into recv when nothing that round reads could be under it.
 */
#include <stdint.h>

#include "comm/algo/algorithms.h"

typedef struct {
    int p, q;
    size_t bytes; /* one block */
} layout;

/* Virtual blocks [lo, hi) as real runs: [lo, hi) and [lo + q, min(hi + q, p)). */
static size_t run_len(const layout *L, int j, int lo, int hi)
{
    if (j == 0) return (size_t)(hi - lo) * L->bytes;
    int a = lo + L->q, b = hi + L->q < L->p ? hi + L->q : L->p;
    return a < b ? (size_t)(b - a) * L->bytes : 0;
}
static size_t run_off(const layout *L, int j, int lo) { return (size_t)(lo + (j ? L->q : 0)) * L->bytes; }

static int overlaps(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + blen && y < x + alen;
}

int dt_reduce_scatter_halving(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    int p = c->size, r = c->rank, q = dt_pow2_floor(p);
    layout L = {p, q, n * dt_dtype_size(c->cur.dtype)};
    size_t total = (size_t)p * L.bytes;
    int rc = 0;
    if (!n) return 0;

    if (r >= q) { /* extra rank: hand the input over, take our block back */
        c->cur_step = "fold extra ranks in";
        dt_p2p op = dt_p2p_send(r - q, send, total);
        rc = dt_p2p_run(c, &op, 1);
        if (rc < 0) return rc;
        c->cur_step = "fold extra ranks out";
        op = dt_p2p_recv(r - q, recv, L.bytes);
        rc = dt_p2p_run(c, &op, 1);
        c->cur_step = NULL;
        return rc < 0 ? rc : 0;
    }

    char *acc = dt_comm_scratch(c, total);
    if (!acc) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %zu bytes", total);
    const char *in = send; /* where this round's unreduced data is */
    if (r < p - q) {
        c->cur_step = "fold extra ranks in";
        dt_p2p op = dt_p2p_recv_reduce(r + q, acc, send, total);
        rc = dt_p2p_run(c, &op, 1);
        if (rc < 0) return rc;
        in = acc;
    }

    c->cur_step = "recursive halving";
    int lo = 0, hi = q, direct = 0;
    for (int mask = q / 2; mask > 0; mask /= 2) {
        int partner = r ^ mask, mid = lo + (hi - lo) / 2;
        int keep_lo = (r & mask) ? mid : lo, keep_hi = (r & mask) ? hi : mid;
        int give_lo = (r & mask) ? lo : mid, give_hi = (r & mask) ? mid : hi;
        dt_p2p ops[4];
        int k = 0;
        for (int j = 0; j < 2; j++) {
            size_t len = run_len(&L, j, give_lo, give_hi);
            if (len) ops[k++] = dt_p2p_send(partner, in + run_off(&L, j, give_lo), len);
        }
        for (int j = 0; j < 2; j++) {
            size_t len = run_len(&L, j, keep_lo, keep_hi), off = run_off(&L, j, keep_lo);
            char *dst = acc + off;
            /* The last round completes block r (j == 0): straight into recv
             * when no op of the round reads memory under recv but the very
             * operand it replaces (recv == in + off). */
            if (mask == 1 && j == 0) {
                direct = in == acc || in + off == (const char *)recv ||
                         !overlaps(recv, L.bytes, send, total);
                if (direct) dst = recv;
            }
            if (len) ops[k++] = dt_p2p_recv_reduce(partner, dst, in + off, len);
        }
        rc = dt_p2p_run(c, ops, k);
        if (rc < 0) return rc;
        lo = keep_lo, hi = keep_hi;
        in = acc;
    }

    if (!direct) dt_local_copy(c, recv, acc + (size_t)r * L.bytes, L.bytes);
    if (r < p - q) {
        c->cur_step = "fold extra ranks out";
        dt_p2p op = dt_p2p_send(r + q, acc + (size_t)(r + q) * L.bytes, L.bytes);
        rc = dt_p2p_run(c, &op, 1);
        if (rc < 0) return rc;
    }
    c->cur_step = NULL;
    return 0;
}
