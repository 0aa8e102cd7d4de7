/*
 * The communicator's insides, shared by the files of src/comm.
 *
 * A job (one per process) holds what the environment gave (rank, size,
 * master, secret, timeout), the store connection, the control monitor and
 * the job-wide abort state. A communicator holds its members, one link per
 * peer (shared memory, TCP or MPI, set up through the table of transports,
 * transport/transport.h), the collective sequence number, its failure
 * message and its progress thread.
 *
 * Algorithms are written as steps: each step is a small array of
 * point-to-point operations (send, receive, receive-and-reduce) that
 * dt_p2p_run posts together and progresses until all are done, spinning
 * briefly, then blocking, never past the deadline.
 */
#ifndef DT_COMM_INTERNAL_H
#define DT_COMM_INTERNAL_H

#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/bootstrap/bootstrap.h"
#include "comm/coll.h"
#include "comm/cost/model.h"
#include "dtrain/comm.h"

struct dt_store_server;
struct dt_store;
struct dt_monitor;
struct dt_shm_comm;
struct dt_async;
struct dt_ext_watch;

/* ---- messages ----------------------------------------------------------- */

#define DT_MSG_MAGIC 0x31544d44u /* "DMT1" */
#define DT_MSG_FLAG_CMA 1u       /* payload to be pulled (by cross-memory attach, */
#define DT_MSG_FLAG_MAPPED 2u    /* or from the mapping of the sender's region) */

/* Every message starts with this header; the receiver checks each field
 * against its own call, so ranks that disagree fail instead of computing
 * garbage. 64 bytes. */
typedef struct {
    uint32_t magic;
    uint32_t comm_tag;
    uint64_t seq;
    uint8_t coll;
    uint8_t dtype;
    uint8_t op;
    uint8_t flags;
    int32_t root;
    uint64_t count;
    uint64_t bytes; /* payload bytes that follow (or are pulled) */
    uint64_t aux[2]; /* transport's use: pull address; ticket (and region fd) */
    int32_t tag;     /* point to point: the sender's tag */
    uint32_t region; /* a mapped pull: the sender's region number */
} dt_msg_hdr;

_Static_assert(sizeof(dt_msg_hdr) == 64, "message header must be one cache line");

/* ---- point-to-point operations ------------------------------------------ */

typedef struct {
    dt_p2p_kind kind;
    int peer;        /* communicator rank */
    const void *src; /* SEND: the data; RECV_REDUCE: local operand */
    void *dst;       /* RECV, RECV_REDUCE: where the result goes */
    size_t bytes;
    /* Progress state, owned by the link while the op runs. */
    int hdr_done;   /* header sent / received and checked */
    size_t hdr_off; /* bytes of header moved so far (stream transports) */
    size_t done;    /* payload bytes moved (and reduced) so far */
    uint64_t ticket;
    dt_msg_hdr hdr; /* received header, or the one being sent */
    /* Point-to-point calls only: the call this op carries (its dtype and
     * count go in the header) and its number in the pair's stream: a
     * send's taken when it starts, a receive's when it has its message
     * (seq_taken). */
    const dt_coll_args *call;
    uint64_t p2p_seq;
    int seq_taken;
    /* A receive of a point-to-point call: how it has its message
     * (p2p_match.c), and the queued one it copies from (while set). */
    int match;
    struct dt_unexpected *from;
    /* A send whose message is all on the link though the send is not
     * complete (the receiver pulls its payload): the next send to the
     * peer may start. */
    int link_free;
} dt_p2p;

/* dt_p2p.match: not yet; the link's next message, which the link's
 * progress takes; or one taken off the link before its receive came (the
 * queue's copy, or a payload that stays with the sender until pulled). */
enum { DT_MATCH_NONE = 0, DT_MATCH_LINK, DT_MATCH_QUEUED };

static inline dt_p2p dt_p2p_send(int peer, const void *src, size_t bytes)
{
    dt_p2p op = {0};
    op.kind = DT_P2P_SEND;
    op.peer = peer;
    op.src = src;
    op.bytes = bytes;
    return op;
}

static inline dt_p2p dt_p2p_recv(int peer, void *dst, size_t bytes)
{
    dt_p2p op = {0};
    op.kind = DT_P2P_RECV;
    op.peer = peer;
    op.dst = dst;
    op.bytes = bytes;
    return op;
}

/* dst = local op incoming (local may equal dst). */
static inline dt_p2p dt_p2p_recv_reduce(int peer, void *dst, const void *local, size_t bytes)
{
    dt_p2p op = {0};
    op.kind = DT_P2P_RECV_REDUCE;
    op.peer = peer;
    op.dst = dst;
    op.src = local;
    op.bytes = bytes;
    return op;
}

/* ---- dry runs ----------------------------------------------------------- */

/* On the stand-in communicators of a dry run (cost/predict.c) nothing
 * moves: the step executor, the algorithms' local steps (algo/local.c)
 * and the scratch hand what they would do to the run instead, which costs
 * or records it. The cost model observes the algorithms through this hook
 * alone; they never call it by name. */
typedef struct dt_dry_run dt_dry_run;
struct dt_dry_run {
    /* A step: ops posted together. */
    void (*step)(dt_dry_run *d, const dt_comm *c, const dt_p2p *ops, int n);
    /* Local work: a copy of `bytes`, or a reduction of n elements of the
     * call's dtype. */
    void (*copy)(dt_dry_run *d, const dt_comm *c, size_t bytes);
    void (*reduce)(dt_dry_run *d, const dt_comm *c, size_t n);
    void *scratch; /* what dt_comm_scratch hands out: an address never touched */
};

/* ---- links (one per peer) --------------------------------------------- */

typedef struct dt_link dt_link;

typedef struct {
    const char *name; /* "shm", "tcp", "mpi" */
    /* Advance op without blocking: 1 when complete, 0 when it must wait for
     * the peer, or a negative DT_ERR_* after dt_comm_fail(). Sets
     * *progressed when any byte moved. */
    int (*progress)(dt_comm *c, dt_link *l, dt_p2p *op, int *progressed);
    /* Fill a pollfd to wait on for op (TCP) and return 1; return 0 when
     * the link waits on the communicator's doorbell (shared memory), or
     * -1 when it moves only inside progress() and nothing wakes a waiter
     * (MPI): waits then poll it, napping in between (dt_poll_nap). */
    int (*pollfd)(dt_link *l, const dt_p2p *op, struct pollfd *pfd);
    /* The header of the next message from the peer, left for the receive
     * that takes it (matching looks before it chooses, p2p_match.c): 1
     * with *h filled, 0 while it has not arrived whole, or a negative
     * DT_ERR_* after dt_comm_fail(). Only between messages: no receive is
     * under way on the link. */
    int (*peek)(dt_comm *c, dt_link *l, dt_msg_hdr *h);
    /* Take that next message's header (h, as peek gave it) off the link
     * and leave its payload with the sender, for a message whose receive
     * has not come: 1, when the link pulls payloads (shared memory's
     * cross-memory attach); then the receive that matches it later
     * progresses with op->hdr = *h and hdr_done set, pulling the payload
     * and completing the send. 0 when the payload follows in the stream
     * and must be taken with it (nothing moved); NULL: never. */
    int (*detach)(dt_comm *c, dt_link *l, const dt_msg_hdr *h);
    void (*destroy)(dt_link *l);
} dt_link_ops;

struct dt_link {
    const dt_link_ops *ops;
    int peer; /* communicator rank */
};

/* A transport's doorbell (a row of the table in transport/transport.h may
 * have one): what its links wait on when they say so (pollfd returns 0),
 * and how another thread wakes a waiter. The step executor reads the bell
 * before each pass over its links; after a fruitless pass it arms (peers
 * then ring), makes one more pass, disarming if that one moved, and else
 * sleeps until the bell moves from what it read (at once when it moved
 * meanwhile). */
typedef struct {
    uint32_t (*read)(const dt_comm *c);
    void (*arm)(dt_comm *c);
    void (*disarm)(dt_comm *c);
    /* Until the bell moves from `seen`, the job aborts or ms pass; disarms. */
    void (*sleep)(dt_comm *c, uint32_t seen, int ms);
    /* Wake c's waiter whatever it waits for (a job abort, a queued request,
     * a peer that left); from any thread, with job->lock held when the
     * communicator may be being set up or torn down. */
    void (*wake)(dt_comm *c);
} dt_doorbell;

/* ---- job (process-wide) ----------------------------------------------- */

typedef struct dt_job {
    int rank, size, local_rank, local_size; /* from the environment */
    char launcher[16];                      /* "torchrun", "openmpi", "pmi", "slurm", "none" */
    char master_addr[256];
    int master_port;
    char advertise_addr[64]; /* address of the interface that reaches master_addr */
    char secret[256];
    char job_id[64];
    double timeout_s;
    int force_tcp; /* DTRAIN_TRANSPORT=tcp */
    int use_mpi;   /* DTRAIN_TRANSPORT=mpi: links between ranks are MPI's */
    char hostname[256];
    char boot_id[64];
    dt_cost_model model; /* alpha/beta/gamma per link kind, same on every rank */
    _Atomic unsigned model_version; /* bumped when the model changes */
    int store_by_launcher;          /* DTRAIN_STORE_SERVER=launcher: rank 0 does not serve */
    int port_hold;                  /* dt_bootstrap's, until the store serves; -1: none */
    struct dt_store_server *server; /* rank 0, unless the launcher serves */
    struct dt_store *store;
    struct dt_monitor *monitor;
    /* Joined through the caller's store (external.c): its callbacks, and
     * the watcher that stands in for the control channel; else NULL. */
    const dt_kv_ops *kv;
    void *kv_ctx;
    struct dt_ext_watch *watch;
    pthread_mutex_t store_lock; /* the store connection has one user at a time */
    /* Ranks that left (called dt_comm_destroy) while the job ran, as the
     * store told: when we heard (dt_now_ns), 0 for ranks still here. */
    _Atomic uint64_t *left_ns; /* [size] */
    atomic_int nleft;
    /* Of them, ranks whose process ended without leaving (seen by an
     * external job's watcher); NULL in other jobs. */
    atomic_uchar *exited;
    /* Abort state: set once, by a local failure or by the store. */
    atomic_int aborted;
    int abort_code;
    char abort_msg[512];
    pthread_mutex_t lock;
    int wake_fd; /* eventfd written on abort; TCP waits poll it */
    dt_comm **comms; /* live communicators, to wake on abort */
    int ncomms, comms_cap;
    int comm_counter;
} dt_job;

/* ---- communicator ------------------------------------------------------ */

struct dt_comm {
    dt_job *job;
    char id[96];      /* "w" for the world, "w.s0c3" for a split, ... */
    uint32_t tag;     /* hash of id, carried in every header */
    int rank, size;
    int local_rank, local_size;
    int *world_rank;  /* [size] */
    int *host_of;     /* [size] host index, equal for ranks sharing memory */
    dt_link **links;  /* [size], NULL for self */
    const dt_doorbell *doorbell; /* what waits sleep on (NULL on a stand-in) */
    struct dt_shm_comm *shm;
    char transport_name[16]; /* "shm+tcp", ... (transport/transport.c) */
    uint64_t seq;          /* sequence number of the next collective */
    _Atomic uint64_t bytes_sent; /* payload bytes this rank has sent (dt_comm_bytes_sent) */
    _Atomic uint64_t bytes_off_host; /* of them, to ranks on other hosts */
    uint64_t *p2p_send_seq; /* [size] per peer: point-to-point messages sent, */
    uint64_t *p2p_recv_seq; /* and taken off the link (to a receive or the queue) */
    int any_next; /* the peer a receive from any source looks at first */
    /* Point-to-point messages taken off their links before a receive
     * wanted them (p2p_match.c), and what they may hold in all
     * (DTRAIN_P2P_QUEUE_MB). */
    struct dt_p2p_queue *queue;
    size_t p2p_queue_limit;
    dt_coll_args cur;     /* the collective being run */
    uint64_t cur_seq;
    const char *cur_step; /* algorithm step, for messages */
    int split_count;
    /* Failure: set once; later calls return failed_code at once. */
    atomic_int failed;
    int failed_code;
    char err[768];
    pthread_mutex_t err_lock;
    struct dt_async *async;
    /* Scratch for algorithms that need a temporary buffer. */
    void *scratch;
    size_t scratch_bytes;
    int spin_limit;
    uint64_t spin_ns;  /* and at most this long (DT_SPIN_NS; no cap when DTRAIN_SPIN is set) */
    uint64_t yield_ns; /* after the spin, yield the core this long before sleeping */
    int kernel_ranks;  /* members on this one's kernel (its boot id), which share its
                          CPUs whatever hosts they pose as; 0: not known */
    /* Algorithms: forced per collective (DT_ALGO_AUTO: choose), and auto's
     * choices by message size (log2 of bytes), valid for model_seen. */
    int algo_forced[DT_COLL_KIND_COUNT];
    signed char auto_choice[DT_COLL_KIND_COUNT][64];
    unsigned model_seen;
    int nhosts;               /* distinct hosts among the members */
    dt_dry_run *dry;          /* set on the stand-in communicators of a dry run */
    void *mpi;                /* the matching MPI communicator (mpi.h), or NULL */
};

/* The job (job.c): made from the environment, joined to the store and the
 * control channel (multi-rank jobs), holding its live communicators.
 * dt_job_new makes one from what a bootstrap says, however it was found. */
int dt_job_create(dt_job **out, char *err, size_t errlen);
int dt_job_new(const dt_bootstrap *b, dt_job **out);
int dt_job_connect(dt_job *job, char *err, size_t errlen);
void dt_job_disconnect(dt_job *job);
/* Say goodbye to the store (the rank leaves the job): first thing in the
 * world communicator's destroy, so that peers hear before its links go. */
void dt_job_leave(dt_job *job);
void dt_job_free(dt_job *job);
int dt_job_register(dt_job *job, dt_comm *c);
void dt_job_unregister(dt_job *job, dt_comm *c);

/* The world communicator of a job just made and joined (comm.c): the host
 * map, the links, the shared cost model. On failure the job is freed, the
 * message (prefixed with what) is in dt_last_error() and *out is NULL. */
int dt_comm_world_init(dt_job *job, const char *what, dt_comm **out);
/* A start that failed before its world communicator: the message
 * (prefixed with what) into dt_last_error(), told to the other ranks, and
 * the job freed. Returns rc. */
int dt_comm_init_failed(dt_job *job, int rc, const char *what, const char *err);

/* Record a failure of c (first one wins), prefixed with the collective, its
 * sequence number and the peer; also aborts the job so that every rank
 * learns of it. Returns code. */
int dt_comm_fail(dt_comm *c, int code, int peer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The store says world rank `rank` left the job (failure.c). */
void dt_job_note_left(dt_job *job, int rank);
/* Tell the other ranks of this rank's failure, through the control
 * channel or, in an external job, the caller's store; 0 when the job has
 * neither (a job of one rank). */
int dt_job_report(dt_job *job, int code, int suspect, int is_timeout, const char *msg);
/* Whether the peer of op (a member of c) has left the job, waiting up to
 * wait_s for the store's word while the job has not aborted. */
int dt_comm_peer_left(dt_comm *c, int peer, double wait_s);
/* Fail c because the peer op waits on left the job (dt_comm_destroy);
 * `also` is appended to the message (may be ""). */
int dt_comm_fail_left(dt_comm *c, const dt_p2p *op, const char *also);
/* Fail c with the job's abort cause (found by another rank or the store);
 * `during` is appended to "job aborted" (may be ""). */
int dt_comm_fail_from_abort(dt_comm *c, const char *during);
/* Job-wide abort: stores the message, wakes every waiting communicator.
 * Called by the monitor when the store broadcasts, and by dt_comm_fail. */
void dt_job_abort(dt_job *job, int code, const char *msg);
/* Record a bad argument's message in c (unless c has failed; c stays
 * usable) and return DT_ERR_INVALID (collectives.c). */
int dt_comm_invalid(dt_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A dt_alltoallv call's counts, displacements and buffers, checked
 * (alltoallv_args.c); sets a->count to the largest per-peer count. */
int dt_alltoallv_check(dt_comm *c, dt_coll_args *a);
/* A scratch buffer of at least bytes, owned by c. */
void *dt_comm_scratch(dt_comm *c, size_t bytes);
uint64_t dt_comm_deadline(const dt_comm *c);

/* Whether this build has Open MPI underneath (mpi_coll.c). */
int dt_have_mpi(void);

/* Post ops together and progress until all complete (0), or fail. Ops on
 * the same peer and direction complete in array order; at most
 * DT_P2P_MAX_OPS of them. */
#define DT_P2P_MAX_OPS 64
/* A wait spins at most this long by default, whatever its poll count: a
 * poll over TCP is a recvmsg call, and 4000 of them took 6 ms (4000 polls
 * of shared memory take 110-150 us; a sleep and a wake-up on a virtual
 * machine 50-150). The progress thread's waits poll as long (async.c). */
#define DT_SPIN_NS 100000ull
/* With more ranks on a host than cores, a wait that spun in vain yields
 * the core for up to this long before it sleeps: the peer it waits for is
 * often runnable on the same core, and a yield hands it over in a couple
 * of microseconds where a futex sleep and wake take tens. */
#define DT_YIELD_NS 500000ull
int dt_p2p_run(dt_comm *c, dt_p2p *ops, int n);
/* Queued dt_isend/dt_irecv calls that the progress thread runs as one step. */
#define DT_P2P_BATCH 32
/* The op for one send/recv call (numbered in its pair's stream when it
 * starts, by the executor). */
dt_p2p dt_p2p_from_call(const dt_coll_args *call);
/* dt_p2p_run whose op list may grow while it runs: refill(arg, ops, n, cap)
 * returns the new count (for requests queued meanwhile). */
typedef int (*dt_p2p_refill_fn)(void *arg, dt_p2p *ops, int n, int cap);
int dt_p2p_run_growing(dt_comm *c, dt_p2p *ops, int n, int cap, dt_p2p_refill_fn refill,
                       void *arg);
/* The pause between polls of links (or requests) that only move when
 * polled: a yield at first, then sleeps that grow with idle_ns, the time
 * since anything moved, up to a fraction of a millisecond. */
void dt_poll_nap(uint64_t idle_ns);
/* Receives of point-to-point calls, matched by source and tag
 * (p2p_match.c). The queue of messages taken off their links before their
 * receive came: made with the communicator, freed with it. */
#define DT_P2P_QUEUE_MB 256 /* DTRAIN_P2P_QUEUE_MB's default */
struct dt_p2p_queue *dt_p2p_queue_new(int size);
void dt_p2p_queue_free(struct dt_p2p_queue *q);
/* A pass's matching, before the ops progress: receives without a message
 * take queued ones, in posting order; the next message of each link they
 * may take from goes to the first of them it matches, or into the queue;
 * copies into the queue advance. 0, or a negative DT_ERR_* after failing
 * c (a receive that can never match, the queue full). */
int dt_p2p_match(dt_comm *c, dt_p2p *ops, const unsigned char *done, int n, int *progressed);
/* Progress a receive whose message was copied into the queue (op->from):
 * 1 once it is in op->dst, 0 while the copy is still coming off its link. */
int dt_p2p_take_queued(dt_comm *c, dt_p2p *op, int *progressed);
/* The op copying peer's next message into the queue, or NULL: a receive
 * on that link waits for it. */
const dt_p2p *dt_p2p_copying(const dt_comm *c, int peer);
/* Whether a wait for ops[i], a receive without its message yet, watches
 * peer's link: one it may take from, not carrying another message (whose
 * own op waits on it) nor holding a collective's next (nothing takes that
 * while the step waits, and a socket holding it would wake the wait at
 * once, again and again). */
int dt_p2p_match_waits_on(dt_comm *c, const dt_p2p *ops, const unsigned char *done, int n,
                          int i, int peer);
/* For a failure's message: the queued messages ops[i] (a receive without
 * its message) passed over, and, from any source, the peers whose next
 * message is a collective's: "; messages from rank 1 passed over: tagged
 * 9 (400 bytes)", or "". */
void dt_p2p_passed_over(dt_comm *c, const dt_p2p *ops, const unsigned char *done, int n, int i,
                        char *buf, size_t len);
/* Header helpers for links: fill from the current collective; check a
 * received one (fails c with a mismatch message naming both sides). */
void dt_p2p_fill_hdr(const dt_comm *c, const dt_p2p *op, dt_msg_hdr *h);
int dt_p2p_check_hdr(dt_comm *c, const dt_p2p *op, const dt_msg_hdr *h);
/* Reduce incoming bytes into op's destination: dst[off..] = src[off..] op in. */
void dt_p2p_reduce_chunk(const dt_comm *c, dt_p2p *op, size_t off, const void *in, size_t bytes);

/* Store access from communicator code (serialised by job->store_lock);
 * keys are prefixed with the communicator's id. */
int dt_comm_store_set(dt_comm *c, const char *key, const void *val, size_t len);
int dt_comm_store_get(dt_comm *c, const char *key, void **val, size_t *len);
int dt_comm_store_barrier(dt_comm *c, const char *key);

#endif
