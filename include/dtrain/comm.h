/*
 * dtrain communicator: collective and point-to-point communication between
 * the ranks of a job, over shared memory (ranks on one host) and TCP (ranks
 * on different hosts).
 *
 * Conventions (NCCL/Gloo-shaped):
 *  - every call returns 0 (DT_OK) or a negative DT_ERR_* code; after an error
 *    dt_comm_error() says what happened, naming the peer, the collective and
 *    its sequence number. A failed communicator stays failed: later calls
 *    return DT_ERR_ABORTED at once.
 *  - counts are in elements. All-gather, reduce-scatter, gather and scatter
 *    counts are per rank; all-to-all counts are per peer.
 *  - in place when send == recv. For all-gather and gather the rank's own
 *    block is then read from its slot in recv; for reduce-scatter the input
 *    is the whole of recv (size * count elements) and the result lands at
 *    its start (MPI_IN_PLACE rules). NCCL's in-place layouts
 *    (send == recv + rank * count) work too.
 *  - every rank gets bit-identical results: reductions run in a fixed order.
 *  - a communicator is driven by one thread at a time (as in MPI and NCCL);
 *    different communicators may be driven from different threads.
 */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_comm dt_comm;
typedef struct dt_request dt_request;

typedef enum {
    DT_F32 = 0,
    DT_F64,
    DT_BF16,
    DT_F16,
    DT_I32,
    DT_I64,
    DT_U8,
    DT_DTYPE_COUNT
} dt_dtype;

typedef enum {
    DT_SUM = 0,
    DT_AVG,
    DT_MAX,
    DT_MIN,
    DT_PROD,
    DT_BAND, /* bitwise and, or, exclusive or: integer dtypes only */
    DT_BOR,
    DT_BXOR,
    DT_OP_COUNT
} dt_op;

enum {
    DT_OK = 0,
    DT_ERR_INVALID = -1,  /* bad argument or configuration */
    DT_ERR_SYSTEM = -2,   /* an operating-system call failed */
    DT_ERR_TIMEOUT = -3,  /* a wait passed its deadline (DTRAIN_TIMEOUT) */
    DT_ERR_PEER = -4,     /* a peer died or its connection broke */
    DT_ERR_MISMATCH = -5, /* ranks disagree on collective, count, dtype, op or root */
    DT_ERR_ABORTED = -6,  /* the job was aborted because another rank failed */
    DT_ERR_NOMEM = -7,
    DT_ERR_AUTH = -8,     /* a connection did not present the job's secret */
    DT_ERR_PROTOCOL = -9  /* malformed data on the wire */
};

/* Colour for dt_comm_split meaning "not in any new communicator". */
#define DT_UNDEFINED (-1)

/* A short name for an error code ("timeout", "mismatch", ...). */
const char *dt_strerror(int code);
const char *dt_dtype_name(dt_dtype t);
const char *dt_op_name(dt_op op);
size_t dt_dtype_size(dt_dtype t);

/*
 * Join the job described by the environment: torchrun (RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI
 * (OMPI_COMM_WORLD_*), MPICH/PMI (PMI_RANK, PMI_SIZE) or Slurm
 * (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), in that order; with none of
 * them the job is this process alone. On failure *out is NULL and the
 * message is in dt_last_error().
 */
int dt_comm_init(dt_comm **out);
/* The message of the last failed dt_comm_init in this process. */
const char *dt_last_error(void);

/*
 * A key-value store the caller already has (a framework's rendezvous, such
 * as PyTorch's c10d store), for dt_comm_init_external. Each call returns
 * 0 or a negative DT_ERR_* code, and on failure writes a message into err
 * (errlen bytes). dtrain makes one call at a time per communicator, from
 * the thread that creates it and from a watcher thread of its own, so ctx
 * must stay valid until dt_comm_destroy returns.
 */
typedef struct dt_kv_ops {
    /* Store len bytes of val under key. */
    int (*set)(void *ctx, const char *key, const void *val, size_t len, char *err,
               size_t errlen);
    /* Wait up to timeout_s seconds for key to exist, then give a malloc'd
     * copy of its value (dtrain frees it) and its length; DT_ERR_TIMEOUT
     * when it did not appear in time. dtrain waits in slices of under a
     * second, so a timeout must leave the store usable. */
    int (*get)(void *ctx, const char *key, double timeout_s, void **val, size_t *len, char *err,
               size_t errlen);
    /* Add delta to the integer counter under key (0 when absent) and give
     * its new value; delta 0 reads it. */
    int (*add)(void *ctx, const char *key, int64_t delta, int64_t *result, char *err,
               size_t errlen);
} dt_kv_ops;

/*
 * Join a job through the caller's store instead of the environment: a
 * world communicator of size ranks, this one being rank. Every rank calls
 * it with the same store (keys may be prefixed, as long as every rank's
 * calls reach the same keys), which must be fresh: dtrain's keys from an
 * earlier communicator must not be in it. timeout_s bounds every wait
 * (DTRAIN_TIMEOUT, when set, overrides it; 0 takes DTRAIN_TIMEOUT or its
 * default). The ranks of a host share memory, the others are joined by
 * TCP (DTRAIN_TRANSPORT applies; mpi does not); for several hosts, set
 * MASTER_ADDR to an address of rank 0's host (the interface that reaches
 * it is advertised) or DTRAIN_ADVERTISE_ADDR on each host. Unlike
 * dt_comm_init, a process may hold several such communicators at once,
 * each its own job; failures are told through the store (docs/comm.md).
 * On failure *out is NULL and the message is in dt_last_error().
 */
int dt_comm_init_external(const dt_kv_ops *ops, void *ctx, int rank, int size, double timeout_s,
                          dt_comm **out);

int dt_comm_rank(const dt_comm *c);
int dt_comm_size(const dt_comm *c);
/* Rank among the communicator's members on this host, and their number. */
int dt_comm_local_rank(const dt_comm *c);
int dt_comm_local_size(const dt_comm *c);
/* The host of member `rank` as the lowest member on it (equal for members
 * that share memory), or -1; and this process's host name (the stand-in
 * DTRAIN_HOSTNAME gives, where set), for banners. */
int dt_comm_host_of(const dt_comm *c, int rank);
const char *dt_comm_hostname(const dt_comm *c);
/* Collective over c: ranks with the same colour form a new communicator,
 * ordered by key then old rank. DT_UNDEFINED gives *out = NULL. */
int dt_comm_split(dt_comm *c, int color, int key, dt_comm **out);
const char *dt_comm_error(const dt_comm *c);
/* A rank that fails outside communication stops the job, as MPI_Abort
 * does: every rank's pending and later calls fail with DT_ERR_ABORTED and
 * a message naming this rank and the reason. Destroy c afterwards. */
void dt_comm_abort(dt_comm *c, const char *reason);
/* "shm", "tcp", "shm+tcp", "mpi" or "self": what carries this
 * communicator's messages. */
const char *dt_comm_transport(const dt_comm *c);
/* Waits for c's outstanding requests, then frees everything. For the
 * world communicator this is the rank's goodbye: a peer still waiting for
 * it in a call fails within about a second, naming it (DT_ERR_PEER); after
 * the others are done with it, leaving is silent. */
void dt_comm_destroy(dt_comm *c);

/* Communication memory (NCCL's ncclMemAlloc, MPI_Alloc_mem): zeroed,
 * 64-byte aligned buffers that ranks on the same host read straight from
 * each other's mapping, with no system call and no page pinning, where a
 * buffer from malloc is pulled by cross-memory attach. Any buffer works in
 * any call; messages sent from these are faster (a 2-rank all-to-all-v or
 * all-reduce of 4 KiB-256 MiB 1.3-2.7x faster than from malloc on the Xeon
 * measured; see docs/comm.md). Not tied to a communicator; thread-safe. Plain memory
 * where the system gives no shared file. Free it with dt_comm_mem_free
 * only, and not while an operation sending from it is in flight. A child
 * of fork() does not inherit it. NULL when out of memory. */
void *dt_comm_mem_alloc(size_t bytes);
void dt_comm_mem_free(void *p);

/* Blocking collectives. */
int dt_allreduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_op op);
int dt_broadcast(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root);
int dt_reduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_op op,
              int root);
int dt_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root);
int dt_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root);
int dt_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t);
int dt_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                      dt_op op);
int dt_alltoall(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t);
/* All-to-all with a count per peer (MPI_Alltoallv): send_counts[j]
 * elements from send + send_displs[j] go to rank j, and recv_counts[j]
 * from rank j land at recv + recv_displs[j]; counts and displacements in
 * elements of t. Rank j's send_counts[i] must equal rank i's
 * recv_counts[j]: a pair that disagrees fails on both ranks with
 * DT_ERR_MISMATCH, naming both ranks and both counts, and nothing is
 * written past recv_counts[j]. Zero counts move no payload. Not in place:
 * send == recv, and receive blocks that overlap each other or a send
 * block, are refused (DT_ERR_INVALID). */
int dt_alltoallv(dt_comm *c, const void *send, const size_t *send_counts,
                 const size_t *send_displs, void *recv, const size_t *recv_counts,
                 const size_t *recv_displs, dt_dtype t);
int dt_barrier(dt_comm *c);
/* Point to point (tag 0: see dt_isend_tag); the receiver's count must
 * equal the sender's. */
int dt_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer);
int dt_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer);

/*
 * Non-blocking twins: the call returns at once and a progress thread runs
 * the operations of a communicator in the order they were issued. Buffers
 * must stay untouched until dt_wait returns. dt_wait returns the
 * operation's status and frees the request; dt_test sets *done and, once
 * done, behaves like dt_wait.
 */
int dt_iallreduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_op op,
                  dt_request **req);
int dt_ibroadcast(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root,
                  dt_request **req);
int dt_ireduce(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, dt_op op,
               int root, dt_request **req);
int dt_igather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root,
               dt_request **req);
int dt_iscatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root,
                dt_request **req);
int dt_iallgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                  dt_request **req);
int dt_ireduce_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                       dt_op op, dt_request **req);
int dt_ialltoall(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                 dt_request **req);
/* The four count and displacement arrays, like the buffers, must stay
 * valid and unchanged until dt_wait returns: the progress thread reads
 * them. */
int dt_ialltoallv(dt_comm *c, const void *send, const size_t *send_counts,
                  const size_t *send_displs, void *recv, const size_t *recv_counts,
                  const size_t *recv_displs, dt_dtype t, dt_request **req);
int dt_ibarrier(dt_comm *c, dt_request **req);
int dt_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, dt_request **req);
int dt_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, dt_request **req);
/* The same with a tag (the untagged calls send and expect tag 0). The tag
 * selects, as in MPI: a receive takes the earliest message from its peer
 * with its tag, even when messages with other tags were sent before it;
 * a pair's messages of one tag arrive in the order they were sent, and
 * each message goes to the first receive posted that can take it.
 * Messages that come before their receive wait in a queue of the
 * communicator (DTRAIN_P2P_QUEUE_MB, 256 MiB by default; past it the
 * communicator fails with DT_ERR_NOMEM, naming the message). A receive
 * that can never match (its peer's next message is a collective's, the
 * peer left, DTRAIN_TIMEOUT passed) fails, listing the messages it passed
 * over. */
int dt_isend_tag(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, int tag,
                 dt_request **req);
int dt_irecv_tag(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, int tag,
                 dt_request **req);
/* Receive from any source: the earliest message with this tag of
 * whichever member's comes first (collectives' messages are never taken).
 * A pair's messages of one tag still arrive in the order they were sent.
 * *source (when not NULL) is the sender's rank once the call succeeded,
 * -1 until it has one. Each message goes to the first receive posted that
 * can take it, as in MPI. The count must equal the sender's; a
 * communicator of one rank refuses the call (DT_ERR_INVALID). */
int dt_recv_any(dt_comm *c, void *buf, size_t count, dt_dtype t, int tag, int *source);
int dt_irecv_any(dt_comm *c, void *buf, size_t count, dt_dtype t, int tag, int *source,
                 dt_request **req);
int dt_wait(dt_request *req);
int dt_test(dt_request *req, int *done);

/* Payload bytes this rank has sent on c so far (headers not counted), for
 * measuring what a strategy moves per step. */
uint64_t dt_comm_bytes_sent(const dt_comm *c);
/* Of them, the bytes sent to ranks on other hosts (over the network). */
uint64_t dt_comm_bytes_sent_off_host(const dt_comm *c);
/* Nanoseconds the progress threads of this process (every communicator's)
 * have spent running non-blocking operations so far: communication that
 * ran beside the caller's work, or was waited for. */
uint64_t dt_comm_background_ns(void);

/* dt_wait that also gives when the progress thread started and finished
 * the operation (CLOCK_MONOTONIC, ns), for overlap studies. */
int dt_wait_timed(dt_request *req, uint64_t *start_ns, uint64_t *end_ns);
/* dt_test that, once done, gives the same times. */
int dt_test_timed(dt_request *req, int *done, uint64_t *start_ns, uint64_t *end_ns);

/*
 * Algorithms. All-reduce, broadcast, all-gather, reduce-scatter,
 * all-to-all and all-to-all-v each have several (see docs/comm.md); by
 * default ("auto") each call takes the one the cost model predicts fastest
 * for its size, the same on every rank. DTRAIN_<COLLECTIVE>_ALGO (for
 * example DTRAIN_ALLREDUCE_ALGO=ring) or dt_comm_set_algo forces one; the
 * setting applies to calls issued after it, and every rank must make the
 * same. Collective names: "allreduce", "broadcast", "allgather",
 * "reduce_scatter", "alltoall", "alltoallv". For "alltoallv" the count of
 * dt_comm_algo_for and dt_comm_predict_us is a per-peer count, as if every
 * peer got that many.
 */
int dt_comm_set_algo(dt_comm *c, const char *collective, const char *algo);
/* The names of a collective's algorithms (up to max of them into names);
 * returns how many there are, or DT_ERR_INVALID. */
int dt_comm_algo_names(const char *collective, const char **names, int max);
/* One line saying what the algorithm does, or NULL. */
const char *dt_comm_algo_summary(const char *collective, const char *algo);
/* The algorithm a call of count elements of t would run now ("self" on
 * one rank), or NULL for a bad argument. */
const char *dt_comm_algo_for(dt_comm *c, const char *collective, size_t count, dt_dtype t);
/* The cost model's prediction for algo on such a call, in microseconds;
 * negative when it cannot say (MPI's algorithms) or for a bad argument. */
double dt_comm_predict_us(dt_comm *c, const char *collective, const char *algo, size_t count,
                          dt_dtype t);
/* Collective: measure alpha, beta and gamma of the links this
 * communicator uses (a fraction of a second), make them the job's model,
 * and, on rank 0 when save_path is not NULL, write them there for
 * DTRAIN_COMM_MODEL to read in later jobs. */
int dt_comm_calibrate(dt_comm *c, const char *save_path);
/* The job's model, a line per link kind. */
void dt_comm_describe_model(const dt_comm *c, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
