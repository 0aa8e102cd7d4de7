/*
 * A collective's schedule, per rank, as the real algorithm runs it: each
 * rank of the stand-in world (sim/world.h) runs the algorithm of
 * src/comm/algo dry, with a hook (comm/cost/dry.h) that records its steps
 * (the sends and receives posted together) and its local copies and
 * reductions (as seconds of the cost model). The engine (sim/engine.h)
 * plays them back over the simulated network.
 *
 * Size: a ring all-reduce over 10,000 ranks is 2 x 10^8 steps. Each
 * entry is packed with variable-length integers, a peer as its distance
 * from the rank (+-1 on a ring: one byte) and the bytes in as few bytes
 * as they need, so a ring step of two ops takes about 7 bytes (about
 * 1.4 GB for that ring, against 2.4 GB at 12 bytes an op). A recording
 * above DT_SIM_SCHED_MAX is refused with a message. The DDP and
 * collective modes record every distinct collective once (buckets of one
 * size share a schedule).
 *
 * Entries of a rank, one after another:
 *   step:  varint (n << 1), then n ops: varint (zigzag(peer - rank) << 2
 *          | dt_p2p_kind), varint bytes
 *   local: varint 1, then the seconds as 8 bytes (a double)
 * Groups other than the whole world (tensor-parallel groups, a stage's
 * replicas) record on a stand-in world of the group's members, its host
 * map taken from theirs (sim/group.h); the engine maps member indices to
 * ranks where it posts the ops.
 */
#ifndef DT_SIM_COLL_H
#define DT_SIM_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/coll.h"
#include "sim/world.h"

#define DT_SIM_SCHED_MAX (6ull << 30)

typedef struct {
    dt_coll_kind kind;
    char algo[24];      /* the algorithm that ran (auto's pick resolved) */
    char label[48];     /* "allreduce rhd", for traces */
    size_t bytes;       /* per rank, in the nccl-tests sense (see dt_sim_coll_count) */
    int size;           /* ranks */
    unsigned char *code;
    size_t *start;      /* [size + 1]: rank r's entries are code[start[r] .. start[r + 1]) */
    size_t steps;       /* over all ranks */
    double predicted;   /* dt_cost_predict's seconds (the slowest rank, no contention) */
} dt_sim_sched;

/* "allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall":
 * 0, or -1 with the choices in err. */
int dt_sim_coll_kind(const char *name, dt_coll_kind *k, char *err, size_t len);

/* The call of collective `kind` for `bytes` of fp32 data over p ranks
 * (for all-gather, reduce-scatter and all-to-all all ranks' data
 * together): at least one element, so that every rank has something to
 * send. And its bytes counted that way, as recorded (whole elements). */
dt_coll_args dt_sim_coll_call(dt_coll_kind kind, size_t bytes, int p);
size_t dt_sim_coll_bytes(const dt_coll_args *a, int p);

/* The schedule of collective `kind` of `bytes` (fp32 data; for
 * all-gather, reduce-scatter and all-to-all all ranks' data together, as
 * nccl-tests and `dtrain bench comm` count it) over the whole world, by
 * algorithm `algo` (NULL or "auto": dt_algo_pick's choice). 0, or -1 with
 * a message (an unknown algorithm, with the choices; too big, refused
 * before recording where the closed-form count shows it, sim/sched_size.h,
 * with an algorithm that fits). */
int dt_sim_sched_record(dt_sim_sched *s, dt_sim_world *w, dt_coll_kind kind, const char *algo,
                        size_t bytes, char *err, size_t len);
void dt_sim_sched_free(dt_sim_sched *s);

/* The cost model's seconds for that collective by auto's choice (its name
 * in *algo, may be NULL), without simulating: the slowest rank's steps
 * summed, no contention (dt_cost_predict). 0 on one rank; -1 when no
 * algorithm runs there. What `dtrain plan` weighs layouts by. */
double dt_sim_coll_predict(dt_sim_world *w, dt_coll_kind kind, size_t bytes, const char **algo);

/* Reading a rank's entries back. */
typedef struct {
    const unsigned char *p, *end;
    int rank;
} dt_sim_cursor;

typedef struct {
    int local;      /* 1: local work of `seconds`; 0: a step of nops ops */
    int nops;
    double seconds;
} dt_sim_entry;

typedef struct {
    int kind; /* dt_p2p_kind */
    int peer;
    size_t bytes;
} dt_sim_op_rec;

static inline dt_sim_cursor dt_sim_cursor_at(const dt_sim_sched *s, int rank)
{
    return (dt_sim_cursor){s->code + s->start[rank], s->code + s->start[rank + 1], rank};
}
/* The next entry: 1, or 0 at the end. A step's ops follow through
 * dt_sim_cursor_op, nops times. */
int dt_sim_cursor_next(dt_sim_cursor *c, dt_sim_entry *e);
void dt_sim_cursor_op(dt_sim_cursor *c, dt_sim_op_rec *op);

#endif
