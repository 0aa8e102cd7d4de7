/*
 * The two halves of a ring, over any group of ranks and any block split,
 * shared by the ring all-reduce, the ring all-gather, the van de Geijn
 * broadcast and the hierarchical all-reduce.
 *
 * Reduce-scatter: in step s member i passes block (i - s) to its right
 * neighbour and folds the block (i - s - 1) arriving from its left into
 * its own input; after n-1 steps member i holds the complete block
 * (i + 1) % n. Each block's sum is formed once, along one path, so every
 * member ends with the same bits. Out of place, a block is first written
 * by the step that folds the incoming partial into our input, so the
 * input is never copied.
 *
 * All-gather: member i starts with block (i + shift) % n and forwards, in
 * step s, the block it received in step s-1.
 */
#include "comm/algo/algorithms.h"

static int ring_step(dt_comm *c, const dt_group *g, dt_p2p out, dt_p2p in)
{
    dt_p2p ops[2];
    int n = 0;
    if (out.bytes) ops[n++] = out;
    if (in.bytes) ops[n++] = in;
    (void)g;
    return dt_p2p_run(c, ops, n);
}

int dt_ring_reduce_scatter_blocks(dt_comm *c, const dt_group *g, const void *send, void *buf,
                                  size_t total, size_t unit)
{
    int n = g->size, me = g->me;
    int right = dt_group_peer(g, dt_mod(me + 1, n)), left = dt_group_peer(g, dt_mod(me - 1, n));
    const char *in_buf = send;
    char *b = buf;
    c->cur_step = "ring reduce-scatter";
    for (int s = 0; s < n - 1; s++) {
        int o = dt_mod(me - s, n), i = dt_mod(me - s - 1, n);
        size_t ooff = dt_block_off(total, n, o) * unit, ioff = dt_block_off(total, n, i) * unit;
        /* Step 0 sends our own input; later steps forward the partial that
         * the previous step left in buf. */
        dt_p2p out = dt_p2p_send(right, (s == 0 ? in_buf : b) + ooff, dt_block_len(total, n, o) * unit);
        dt_p2p in = dt_p2p_recv_reduce(left, b + ioff, in_buf + ioff, dt_block_len(total, n, i) * unit);
        int rc = ring_step(c, g, out, in);
        if (rc < 0) return rc;
    }
    return 0;
}

int dt_ring_allgather_blocks(dt_comm *c, const dt_group *g, void *buf, size_t total, size_t unit,
                             int shift)
{
    int n = g->size, me = g->me;
    int right = dt_group_peer(g, dt_mod(me + 1, n)), left = dt_group_peer(g, dt_mod(me - 1, n));
    char *b = buf;
    c->cur_step = "ring all-gather";
    for (int s = 0; s < n - 1; s++) {
        int o = dt_mod(me + shift - s, n), i = dt_mod(me + shift - s - 1, n);
        dt_p2p out = dt_p2p_send(right, b + dt_block_off(total, n, o) * unit, dt_block_len(total, n, o) * unit);
        dt_p2p in = dt_p2p_recv(left, b + dt_block_off(total, n, i) * unit, dt_block_len(total, n, i) * unit);
        int rc = ring_step(c, g, out, in);
        if (rc < 0) return rc;
    }
    return 0;
}
