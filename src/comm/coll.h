/*
 * What a collective call is, as data: its kind and arguments, and the
 * point-to-point operations the algorithms' steps are made of. This is
 * the vocabulary that the rest of the library shares with the
 * communicator when it costs, records or plans collectives (the cost
 * model's dry runs, cost/dry.h; the simulator; the planner), without the
 * communicator's insides (comm_internal.h).
 */
#ifndef DT_COMM_COLL_H
#define DT_COMM_COLL_H

#include <stddef.h>

#include "dtrain/comm.h"

typedef enum {
    DT_COLL_NONE = 0,
    DT_COLL_SEND,
    DT_COLL_BARRIER,
    DT_COLL_BROADCAST,
    DT_COLL_REDUCE,
    DT_COLL_GATHER,
    DT_COLL_SCATTER,
    DT_COLL_ALLREDUCE,
    DT_COLL_ALLGATHER,
    DT_COLL_REDUCE_SCATTER,
    DT_COLL_ALLTOALL,
    DT_COLL_ALLTOALLV,
    DT_COLL_KIND_COUNT
} dt_coll_kind;

const char *dt_coll_name(dt_coll_kind k);

/* An all-to-all-v's counts and displacements, in elements, one per peer
 * (MPI_Alltoallv's meaning): the caller's arrays, valid until the call
 * completes. All NULL in a uniform call (the cost model's and the
 * simulator's): then every peer gets `count` elements, packed in rank
 * order, as in an all-to-all. */
typedef struct {
    const size_t *send_counts, *send_displs;
    const size_t *recv_counts, *recv_displs;
} dt_coll_v;

/* One collective call: what the user asked for. */
typedef struct {
    dt_coll_kind kind;
    const void *send;
    void *recv;
    size_t count;
    dt_dtype dtype;
    dt_op op;
    int root; /* root, or peer for send/recv */
    int is_recv; /* DT_COLL_SEND: 1 for the receiving side */
    int tag;     /* DT_COLL_SEND: the caller's label, which both sides must give alike */
    /* DT_COLL_SEND, a receive from any source (root DT_P2P_ANY): set;
     * source, where the sender's rank goes once it is chosen, or NULL. */
    int any_source;
    int *source;
    int algo;    /* index in dt_algo_table, or DT_ALGO_AUTO; fixed at submit */
    dt_coll_v v; /* DT_COLL_ALLTOALLV; count is then its largest per-peer count */
    int stream_out; /* write every output block past the cache (DT_STREAM_MIN), whatever its size */
} dt_coll_args;

/* Whether a collective of kind k combines its data with an op. */
static inline int dt_coll_reduces(dt_coll_kind k)
{
    return k == DT_COLL_ALLREDUCE || k == DT_COLL_REDUCE || k == DT_COLL_REDUCE_SCATTER;
}

/* The elements an all-to-all-v sends to (send != 0) or receives from peer,
 * and their displacement in elements. */
static inline size_t dt_coll_v_count(const dt_coll_args *a, int peer, int send)
{
    const size_t *n = send ? a->v.send_counts : a->v.recv_counts;
    return n ? n[peer] : a->count;
}
static inline size_t dt_coll_v_displ(const dt_coll_args *a, int peer, int send)
{
    const size_t *d = send ? a->v.send_displs : a->v.recv_displs;
    return d ? d[peer] : (size_t)peer * a->count;
}

#define DT_ALGO_AUTO (-1)

/* The operations of a step: send, receive, receive-and-reduce. */
typedef enum { DT_P2P_SEND = 0, DT_P2P_RECV, DT_P2P_RECV_REDUCE } dt_p2p_kind;

/* The peer of a receive from any source until it has chosen its sender. */
#define DT_P2P_ANY (-1)

#endif
