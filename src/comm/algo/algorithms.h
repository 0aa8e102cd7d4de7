/*
 * Collective algorithms, one per file, each a short schedule of steps over
 * dt_p2p_run. They work on buffers that collectives.c has already placed
 * (in-place copies done, own block in its slot), with the collective's
 * dtype and op in c->cur.
 *
 * Every algorithm has one signature (table.h), so that a table can name
 * them, the environment can force them, and the cost model can run any of
 * them dry (c->dry set: steps are costed instead of moved, see
 * cost/predict.c). What the arguments mean depends on the collective:
 *
 *   allreduce       send, recv: n elements (send == recv in place)
 *   reduce_scatter  send: size blocks of n elements; recv: our block of n
 *                   (recv may overlap send)
 *   broadcast       recv: n bytes, holding the data at the root
 *   allgather       recv: size blocks of n bytes, ours already in its slot
 *   alltoall        send, recv distinct: size blocks of n bytes each, our
 *                   own block already copied
 *   alltoallv       send, recv distinct, blocks as c->cur's counts and
 *                   displacements say (dt_alltoallv_op), our own block
 *                   already copied; n: the largest block's bytes (unused)
 *
 * Data an algorithm touches outside a step goes through dt_local_copy and
 * dt_local_reduce, and temporary memory through dt_comm_scratch (one call
 * per algorithm: a second, larger one may move the first), so that a dry
 * run touches no memory at all.
 */
#ifndef DT_COMM_ALGORITHMS_H
#define DT_COMM_ALGORITHMS_H

#include "comm/algo/blocks.h"
#include "comm/algo/table.h"
#include "comm/comm_internal.h"

/* ---- local steps (local.c): handed to a dry run instead of done ---------- */

void dt_local_copy(dt_comm *c, void *dst, const void *src, size_t bytes);
/* dst = a op b, n elements of the current dtype and op. */
void dt_local_reduce(dt_comm *c, void *dst, const void *a, const void *b, size_t n);

/*
 * Non-powers of two, MPICH's way: with q the largest power of two <= p,
 * ranks q..p-1 are "extra" and each pairs with rank r - q. An extra rank
 * hands its input to its partner before the power-of-two algorithm runs
 * among ranks 0..q-1, and gets the result back after. dt_fold_in and
 * dt_fold_out are those two steps; they return 1 on an extra rank (which
 * then skips the middle), 0 on the others, or an error.
 */
int dt_fold_in(dt_comm *c, const void *send, void *acc, size_t bytes);
int dt_fold_out(dt_comm *c, void *buf, size_t bytes);

/* ---- groups: a schedule over some of the communicator's ranks ------------ */

/* Members are communicator ranks rank[0..size-1] (rank NULL: all of them,
 * in order); me is our index among them. */
typedef struct {
    const int *rank;
    int size, me;
} dt_group;

static inline dt_group dt_group_all(const dt_comm *c) { return (dt_group){NULL, c->size, c->rank}; }
static inline int dt_group_peer(const dt_group *g, int i) { return g->rank ? g->rank[i] : i; }

/* buf holds total units of unit bytes split into g->size blocks
 * (dt_block_*). Ring reduce-scatter: send is our input (may equal buf);
 * afterwards member i holds the full reduction of block (i + 1) % size in
 * buf. unit must be the dtype's size. */
int dt_ring_reduce_scatter_blocks(dt_comm *c, const dt_group *g, const void *send, void *buf,
                                  size_t total, size_t unit);
/* Ring all-gather: member i holds block (i + shift) % size of buf; after,
 * every member holds every block. */
int dt_ring_allgather_blocks(dt_comm *c, const dt_group *g, void *buf, size_t total, size_t unit,
                             int shift);
/* Binomial trees over a group, rooted at member root. */
int dt_binomial_reduce(dt_comm *c, const dt_group *g, const void *send, void *recv, size_t count,
                       int root);
int dt_binomial_broadcast(dt_comm *c, const dt_group *g, void *buf, size_t bytes, int root);

/* ---- the algorithms ------------------------------------------------------- */

int dt_allreduce_naive(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_allreduce_ps(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_allreduce_ring(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_allreduce_tree(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_allreduce_butterfly(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_allreduce_rhd(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_allreduce_hier(dt_comm *c, const void *send, void *recv, size_t n, int root);

int dt_broadcast_binomial(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_broadcast_scatter_allgather(dt_comm *c, const void *send, void *recv, size_t n, int root);

int dt_allgather_ring(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_allgather_rd(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_allgather_bruck(dt_comm *c, const void *send, void *recv, size_t n, int root);

int dt_reduce_scatter_ring(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_reduce_scatter_halving(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_reduce_scatter_direct(dt_comm *c, const void *send, void *recv, size_t n, int root);

/* The all-to-all-v's message to (send != 0) or from peer: its block of
 * buf as the call's counts and displacements say. Every algorithm sends
 * each peer exactly this one message, zero counts included (a header
 * alone, which carries the counts that p2p.c checks), so that the pair's
 * disagreements show on both sides and algorithms can be mixed. */
static inline dt_p2p dt_alltoallv_op(const dt_comm *c, const void *buf, int peer, int send)
{
    size_t esz = dt_dtype_size(c->cur.dtype);
    size_t off = dt_coll_v_displ(&c->cur, peer, send) * esz;
    size_t bytes = dt_coll_v_count(&c->cur, peer, send) * esz;
    return send ? dt_p2p_send(peer, (const char *)buf + off, bytes)
                : dt_p2p_recv(peer, (char *)buf + off, bytes);
}

int dt_alltoall_pairwise(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_alltoall_bruck(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_alltoallv_pairwise(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_alltoallv_linear(dt_comm *c, const void *send, void *recv, size_t n, int root);

/* MPI's own collectives (mpi_coll.c; fail cleanly without MPI). */
int dt_allreduce_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_broadcast_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_allgather_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_reduce_scatter_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_alltoall_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root);
int dt_alltoallv_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root);

/* Single-algorithm collectives. */
/* Reduction of every rank's send into recv at the root (recv unused
 * elsewhere); send is never written. */
int dt_reduce_binomial(dt_comm *c, const void *send, void *recv, size_t count, int root);
/* recv (size * block bytes, root only) gathers every rank's block; the
 * root's own block is already in place. */
int dt_gather_linear(dt_comm *c, const void *send, void *recv, size_t block, int root);
/* The root's send (size blocks) is dealt out; the root's own block is
 * copied by the caller. */
int dt_scatter_linear(dt_comm *c, const void *send, void *recv, size_t block, int root);
int dt_barrier_dissemination(dt_comm *c);

#endif
