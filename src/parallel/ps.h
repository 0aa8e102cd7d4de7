/* Parameter server. The last S ranks of the job are servers; each holds one
 * contiguous shard of the flat parameters and its optimizer state. The
 * other W ranks are workers: they hold the whole model, compute gradients
 * on their part of the batch, push each piece to the server that owns it as
 * soon as backward finishes it (layer by layer), and pull the updated
 * parameters back.
 *
 * Synchronous mode: a server waits for the pushes of all W workers, updates
 * once with their mean (DDP's arithmetic), and answers every pull with the
 * same parameters. Asynchronous mode: a server applies each push on its own
 * as it arrives, and answers a pull at once unless the worker is more than
 * `staleness` steps ahead of the slowest worker (stale synchronous
 * parallel). Pushes may be compressed (top-k or int8, with error feedback
 * kept on the worker).
 *
 * Asynchronous mode with a fixed staleness K: the staleness a push sees no
 * longer depends on how the workers are scheduled. A server applies the
 * pushes in a fixed order, step by step and worker by worker within a step,
 * and answers a push of step t with the parameters as they stood once every
 * worker's pushes of the steps before t + 1 - K were in: every worker
 * computes step t on the parameters after t - K steps (the starting ones
 * before step K), so a run is reproducible bit for bit. K = 0 is what
 * staleness 0 does in arrival order, in a fixed order within each step.
 *
 * Every worker talks to the servers over a communicator of its own (the
 * worker and the S servers), so a server serves each worker on a thread of
 * its own and one slow worker never stalls the messages of another. */
#ifndef DT_PARALLEL_PS_H
#define DT_PARALLEL_PS_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"
#include "model/gpt.h"
#include "parallel/compress.h"
#include "model/optimizer.h"

/* A piece of a push: the part of one backward segment inside one server's shard. */
typedef struct {
    int server;
    size_t lo, hi;
} dt_ps_piece;

/* What the servers and workers share: the split of the work and the
 * communicators. Built collectively by dt_ps_join on every rank. */
typedef struct {
    int servers, workers;
    int is_server;
    int index;            /* this rank's index among the servers or among the workers */
    dt_comm *role;        /* the workers among themselves, or the servers among themselves */
    dt_comm **links;      /* worker: links[0] is its own; server: one per worker */
    size_t *shard_lo;     /* servers + 1 bounds over the flat layout */
    int npieces;
    dt_ps_piece *pieces;  /* in the order backward finishes them */
    dt_compress_spec compress;
    int async;
    int staleness;
    int fixed;            /* async: the fixed staleness above */
} dt_ps;

/* How a server orders its updates. */
typedef struct {
    int async;     /* one update per push (else one per step, from all workers) */
    int staleness; /* async: steps a worker may lead the slowest */
    int fixed;     /* async: every worker reads exactly `staleness` steps late */
} dt_ps_mode;

/* Control messages from a worker to a server, on the worker's link. */
enum {
    DT_PS_INIT = 1, /* worker 0 at start: parameters (and saved optimizer state) follow */
    DT_PS_STEP,     /* pushes follow, then the trailer; the server replies and sends parameters */
    DT_PS_PULL,     /* the server sends its parameters */
    DT_PS_FETCH,    /* the server sends parameters, moments and its step count */
    DT_PS_DONE,     /* the worker pushes no more steps: it holds the others back no longer */
    DT_PS_STOP
};
typedef struct {
    int64_t kind, step, arg;
} dt_ps_ctrl;
#define DT_PS_CTRL_COUNT 3

/* Splits the job (world = servers + workers) and the model's layout. A
 * collective over world. 0, or -1 with a message. */
int dt_ps_join(dt_ps *ps, dt_comm *world, int servers, const dt_gpt *layout,
               const dt_compress_spec *compress, const dt_ps_mode *mode, char *err,
               size_t errlen);
void dt_ps_leave(dt_ps *ps);

/* A server's peer index on a link: the worker is 0, server s is 1 + s. */
static inline int dt_ps_server_peer(int s) { return 1 + s; }
static inline size_t dt_ps_shard_len(const dt_ps *ps, int s)
{
    return ps->shard_lo[s + 1] - ps->shard_lo[s];
}

/* How a push of n floats travels: the floats themselves, or the
 * compressed bytes. */
static inline void dt_ps_push_format(const dt_ps *ps, size_t n, dt_dtype *type, size_t *count)
{
    int dense = ps->compress.kind == DT_COMPRESS_NONE;
    *type = dense ? DT_F32 : DT_U8;
    *count = dense ? n : dt_compress_bytes(&ps->compress, n);
}

/* Waits for the n requests that are not NULL and clears them; the first
 * failure's code, or 0. */
int dt_ps_wait_all(dt_request **reqs, int n);

/* Sends or receives a control message on a link. */
int dt_ps_send_ctrl(dt_comm *link, int peer, int64_t kind, int64_t step, int64_t arg);
int dt_ps_recv_ctrl(dt_comm *link, int peer, dt_ps_ctrl *out);

/* Whether every rank's view of the parameters is the same: workers hash
 * each shard's range of their whole copy, servers their own shard, and a
 * min/max all-reduce over world compares them. params is the worker's whole
 * buffer or the server's shard. 1 yes, 0 no, < 0 a communication error. */
int dt_ps_params_identical(dt_ps *ps, dt_comm *world, const float *params, uint64_t *hash_out);

#endif
