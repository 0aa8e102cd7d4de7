/*
 * Collective algorithms, one per file, each a short schedule of steps over
 * dt_p2p_run. They work on bytes in buffers that collectives.c has already
 * normalised (in-place copies done, own block placed), with the collective's
 * dtype and op in c->cur.
 */
#ifndef DT_COMM_ALGORITHMS_H
#define DT_COMM_ALGORITHMS_H

#include "comm/comm_internal.h"

/* Balanced split of count elements into n blocks: block i's offset/length. */
static inline size_t dt_block_off(size_t count, int n, int i)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    return base * (size_t)i + ((size_t)i < rem ? (size_t)i : rem);
}
static inline size_t dt_block_len(size_t count, int n, int i)
{
    return count / (size_t)n + ((size_t)i < count % (size_t)n ? 1 : 0);
}
static inline int dt_mod(int a, int n) { return ((a % n) + n) % n; }

/* recv = reduction of every rank's send (count elements); send may equal recv. */
int dt_allreduce_ring(dt_comm *c, const void *send, void *recv, size_t count);
/* buf holds the data at the root; everyone ends with it. */
int dt_broadcast_binomial(dt_comm *c, void *buf, size_t bytes, int root);
/* Reduction of every rank's send into recv at the root (recv unused
 * elsewhere); send is never written. */
int dt_reduce_binomial(dt_comm *c, const void *send, void *recv, size_t count, int root);
/* recv (size * block bytes, root only) gathers every rank's block; the
 * root's own block is already in place. */
int dt_gather_linear(dt_comm *c, const void *send, void *recv, size_t block, int root);
/* The root's send (size blocks) is dealt out; the root's own block is
 * copied by the caller. */
int dt_scatter_linear(dt_comm *c, const void *send, void *recv, size_t block, int root);
/* recv holds size blocks; ours is in place at our slot. */
int dt_allgather_ring(dt_comm *c, void *recv, size_t block);
/* send: size blocks of count elements; recv: our reduced block. recv may
 * overlap send. */
int dt_reduce_scatter_ring(dt_comm *c, const void *send, void *recv, size_t count);
/* send and recv distinct; own block copied by the caller. */
int dt_alltoall_pairwise(dt_comm *c, const void *send, void *recv, size_t block);
int dt_barrier_dissemination(dt_comm *c);

#endif
