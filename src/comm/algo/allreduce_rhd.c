/*
 * Rabenseifner's all-reduce: a recursive-halving reduce-scatter (each
 * round, partners 2^k apart swap halves of what they still own and each
 * reduces the half it keeps), then a recursive-doubling all-gather (the
 * same rounds backwards, each doubling what a rank holds). 2 lg p
 * messages and 2(p-1)/p of the vector per rank, like ring in bandwidth
 * with far fewer messages. Rank r ends the first half owning block r
 * (blocks of n/q elements); every block is reduced in one place, so all
 * ranks get the same bits. Non-powers of two fold in and out (fold.c).
 */
#include "comm/algo/algorithms.h"

/* Bytes of blocks [lo, hi) of n elements in q blocks. */
static size_t span_off(size_t n, int q, int lo, size_t esz) { return dt_block_off(n, q, lo) * esz; }
static size_t span_len(size_t n, int q, int lo, int hi, size_t esz)
{
    return (dt_block_off(n, q, hi - 1) + dt_block_len(n, q, hi - 1) - dt_block_off(n, q, lo)) * esz;
}

/* The first round reads our input where it is (in), so an out-of-place
 * call never copies it; later rounds work in buf. */
static int halving(dt_comm *c, const char *in, char *buf, size_t n, int q, size_t esz)
{
    int lo = 0, hi = q, r = c->rank;
    c->cur_step = "recursive halving";
    for (int mask = q / 2; mask > 0; mask /= 2) {
        int partner = r ^ mask, mid = lo + (hi - lo) / 2;
        int keep_lo = (r & mask) ? mid : lo, keep_hi = (r & mask) ? hi : mid;
        int give_lo = (r & mask) ? lo : mid, give_hi = (r & mask) ? mid : hi;
        size_t keep = span_off(n, q, keep_lo, esz);
        dt_p2p ops[2] = {dt_p2p_send(partner, in + span_off(n, q, give_lo, esz),
                                     span_len(n, q, give_lo, give_hi, esz)),
                         dt_p2p_recv_reduce(partner, buf + keep, in + keep,
                                            span_len(n, q, keep_lo, keep_hi, esz))};
        int rc = dt_p2p_run(c, ops, 2);
        if (rc < 0) return rc;
        lo = keep_lo, hi = keep_hi;
        in = buf;
    }
    return 0;
}

static int doubling(dt_comm *c, char *buf, size_t n, int q, size_t esz)
{
    int r = c->rank;
    c->cur_step = "recursive doubling";
    for (int mask = 1; mask < q; mask *= 2) {
        int partner = r ^ mask;
        int mine = r & ~(mask - 1), theirs = partner & ~(mask - 1); /* first block of each side */
        dt_p2p ops[2] = {dt_p2p_send(partner, buf + span_off(n, q, mine, esz),
                                     span_len(n, q, mine, mine + mask, esz)),
                         dt_p2p_recv(partner, buf + span_off(n, q, theirs, esz),
                                     span_len(n, q, theirs, theirs + mask, esz))};
        int rc = dt_p2p_run(c, ops, 2);
        if (rc < 0) return rc;
    }
    return 0;
}

int dt_allreduce_rhd(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    size_t esz = dt_dtype_size(c->cur.dtype);
    int p = c->size, q = dt_pow2_floor(p), rc = 0;
    const char *in = send;
    if (c->rank < p - q || c->rank >= q) { /* a fold partner or an extra rank */
        rc = dt_fold_in(c, send, recv, n * esz);
        in = recv;
    }
    if (rc == 0) rc = halving(c, in, recv, n, q, esz);
    if (rc == 0) rc = doubling(c, recv, n, q, esz);
    if (rc >= 0) rc = dt_fold_out(c, recv, n * esz);
    c->cur_step = NULL;
    return rc;
}
