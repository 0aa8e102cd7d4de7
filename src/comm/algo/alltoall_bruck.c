/*
 * Bruck all-to-all: ceil(lg p) rounds instead of pairwise's p-1, each
 * moving about half the data, so it wins for small blocks where the
 * per-message cost dominates. Rotate locally so that position i holds
 * the block for rank r + i; in round k every block whose position has
 * bit k set moves 2^k ranks on (packed into one message to rank r + 2^k,
 * the same positions refilled from rank r - 2^k). A block for rank
 * s + i starting at rank s thus reaches it after the rounds of i's bits,
 * still at position i: position i then holds the block from rank r - i,
 * and the inverse rotation puts it in slot (r - i) mod p.
 *
 * The blocks are worked on in recv itself: in place, send is a copy in
 * the communicator's scratch (collectives.c), so scratch is only taken,
 * for the pack areas, once the first rotation has read all of send. The
 * inverse rotation j <- (r - j) mod p is its own inverse, so it is done
 * in place by swapping pairs of blocks through a pack area.
 */
#include "comm/algo/algorithms.h"

/* Positions i < p with bit `bit` set: runs [s, min(s + bit, p)) for
 * s = bit, 3 bit, 5 bit, ... Returns how many blocks they hold. */
static int positions(int p, int bit)
{
    int cnt = 0;
    for (int s = bit; s < p; s += 2 * bit) cnt += (s + bit < p ? s + bit : p) - s;
    return cnt;
}

/* Copy the blocks at positions with bit `bit` set between w and the
 * contiguous area packed (pack: w -> packed; unpack: packed -> w). */
static void pack(dt_comm *c, char *w, char *packed, int p, int bit, size_t n, int unpack)
{
    size_t at = 0;
    for (int s = bit; s < p; s += 2 * bit) {
        size_t len = (size_t)((s + bit < p ? s + bit : p) - s) * n;
        if (unpack)
            dt_local_copy(c, w + (size_t)s * n, packed + at, len);
        else
            dt_local_copy(c, packed + at, w + (size_t)s * n, len);
        at += len;
    }
}

int dt_alltoall_bruck(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    int p = c->size, r = c->rank;
    const char *in = send;
    char *w = recv;
    if (!n) return 0;

    c->cur_step = "bruck rotation";
    /* w[i] = block for rank (r + i) mod p. */
    dt_local_copy(c, w, in + (size_t)r * n, (size_t)(p - r) * n);
    dt_local_copy(c, w + (size_t)(p - r) * n, in, (size_t)r * n);

    int most = 0;
    for (int bit = 1; bit < p; bit *= 2) {
        int cnt = positions(p, bit);
        if (cnt > most) most = cnt;
    }
    size_t area = (size_t)most * n; /* most >= 1: p >= 2 */
    char *out_pack = dt_comm_scratch(c, 2 * area);
    if (!out_pack) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %zu bytes", 2 * area);
    char *in_pack = out_pack + area;

    for (int bit = 1; bit < p; bit *= 2) {
        size_t len = (size_t)positions(p, bit) * n;
        c->cur_step = "bruck pack";
        pack(c, w, out_pack, p, bit, n, 0);
        c->cur_step = "bruck exchange";
        dt_p2p ops[2] = {dt_p2p_send(dt_mod(r + bit, p), out_pack, len),
                         dt_p2p_recv(dt_mod(r - bit, p), in_pack, len)};
        int rc = dt_p2p_run(c, ops, 2);
        if (rc < 0) return rc;
        c->cur_step = "bruck unpack";
        pack(c, w, in_pack, p, bit, n, 1);
    }

    c->cur_step = "bruck inverse rotation";
    /* Slot j wants w[(r - j) mod p]: swap each pair j < (r - j) mod p. */
    for (int j = 0; j < p; j++) {
        int i = dt_mod(r - j, p);
        if (j >= i) continue;
        dt_local_copy(c, out_pack, w + (size_t)j * n, n);
        dt_local_copy(c, w + (size_t)j * n, w + (size_t)i * n, n);
        dt_local_copy(c, w + (size_t)i * n, out_pack, n);
    }
    c->cur_step = NULL;
    return 0;
}
