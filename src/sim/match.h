/*
 * Pairing sends with receives. A message is known by a key (the
 * collective or channel, the sender, the receiver); the n-th send under a
 * key meets the n-th receive under it, as the transports deliver a pair's
 * messages of one collective in order. Whichever side is posted first
 * waits in the key's queue (only one side can be waiting: a second side
 * arriving would have been paired).
 */
#ifndef DT_SIM_MATCH_H
#define DT_SIM_MATCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t key; /* 0: empty slot (keys are made non-zero) */
    int side, head, tail;
} dt_sim_mslot;

typedef struct {
    dt_sim_mslot *slot;
    size_t mask, used;
    int *node_post, *node_next; /* the queues' nodes */
    int nodes, node_alloc, free_node;
    long long waiting; /* posts queued now */
} dt_sim_match;

/* The key of a message in space `space` (a collective's or a channel's
 * number, < 2^23) from rank src to rank dst (< 2^20 each). */
static inline uint64_t dt_sim_match_key(int space, int src, int dst)
{
    return ((uint64_t)(space + 1) << 40) | ((uint64_t)src << 20) | (uint64_t)dst;
}

/* Post `post` of side `side` (0 send, 1 receive) under key: the oldest
 * post of the other side waiting there, taken off its queue; or -1, this
 * one now waiting; or -2 out of memory. */
int dt_sim_match_pair(dt_sim_match *m, uint64_t key, int side, int post);
void dt_sim_match_free(dt_sim_match *m);

#endif
