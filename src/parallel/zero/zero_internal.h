/* ZeRO's state, shared by its files: zero.c (the strategy's hooks),
 * zero_grads.c (the gradients' reduce-scatter during backward),
 * zero_qgz.c (ZeRO++'s quantized one), zero_params.c (the parameters'
 * gathers). Private to parallel/zero. */
#ifndef DT_PARALLEL_ZERO_INTERNAL_H
#define DT_PARALLEL_ZERO_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "core/alloc.h"
#include "core/slot_pool.h"
#include "core/timer.h"
#include "core/trace.h"
#include "kernels/quant.h"

#include "parallel/strategy.h"
#include "parallel/wire.h"
#include "parallel/zero/shard_map.h"
#include "parallel/zero/zero.h"

typedef struct {
    dt_request *rs;    /* its gradients' reduce-scatter, in flight */
    dt_wire wire;      /* what reduce-scatter works on: the gradients, or their copy in o.wire's type */
    dt_request *ag;    /* its parameters' gather, in flight (stage 3, or 1-2 after the update) */
    int gathered;      /* stage 3: a slot (dt_gpt.param_slots) or the window holds it (or a gather is on its way) */
    int quantized;     /* qwZ: what it holds was sent as int8 */
    unsigned char *qbuf; /* qwZ: every rank's int8 piece and scales, on their way */
    unsigned char *qsend; /* qgZ: its gradients as quantized packets, N of them, and */
    unsigned char *qrecv; /* those of hop 1 received (zero_qgz.c) */
    int grads_held;    /* stages 2-3: its gradients of this micro-batch are in a slot */
    int persistent;    /* stage 3: small enough to stay gathered */
    int stale;         /* a deferred update has not reached its piece yet */
    size_t sec_at;     /* hpZ: where its secondary piece starts in z->sec (floats) */
    int sec_valid;     /* hpZ: that piece holds the current parameters */
    int sec_quantized; /* hpZ: and they came from a qwZ (int8) gather */
    int from_sec;      /* hpZ: the gather in flight is the secondary one */
    float *pbuf;       /* offload_param: its piece, read from the store for a gather */
    int rd;            /* and the read's ticket while in flight, else -1 */
} zero_seg;

/* Bytes a group of communicators sent: all, and those to other hosts. */
typedef struct {
    uint64_t all, off;
} zero_bytes;
#define ZERO_GROUPS 3 /* the data-parallel group, hpZ's, qgZ's */

typedef struct zero {
    dt_strategy *S;
    dt_comm *comm;
    dt_zero_opts o;
    dt_gpt *m;
    int owns_comm;
    int n, me;             /* the group's ranks, and this one */
    dt_shard_map map;
    dt_flat_ranges ranges; /* the map's non-empty pieces, as the trainer sees them (S->shard) */
    dt_flat_range *list;   /* their storage */
    dt_flat_ranges owned;  /* the pieces of what the layers above own (S->owned) */
    dt_flat_range *owned_list;
    size_t held_floats;    /* the floats of the segments that have pieces */
    /* The model's parameter hooks before this layer's (a layer above may
     * have set them): called after this layer's own. */
    int (*prev_need)(void *ctx, int s, int use);
    void (*prev_done)(void *ctx, int s, int use);
    void *prev_ctx;
    zero_seg *seg;
    int nseg, L;

    /* This rank's pieces of the fp32 parameters: stage 3, and every stage
     * with mixed precision (there they are the master weights; the model's
     * params is then only a window). NULL: the pieces sit in m->params. */
    float *shard_p;
    uint16_t *shard16; /* stage 3 with mixed precision: the bf16 pieces gathered from */
    dt_gbuf shard_g; /* stages 2-3: this rank's pieces of the gradients (bf16 with bf16 accumulation) */
    int window_p, window16; /* the model's params / params16 are windows (core/window.h) */
    int mixed;       /* the model trains in mixed precision (bf16 working parameters) */
    int master_whole; /* mixed: the fp32 master weights are gathered whole in m->params */
    int micro, last; /* the micro-batch whose backward runs */
    int in_head;     /* forward has reached the output head */
    int inited;      /* stage 3: the initialisation went piece by piece */
    int error;       /* a failure inside a model hook (reported at the step's end) */
    char errmsg[256];
    size_t live;     /* stage 3: floats gathered now */
    /* Stage 3: the slots of a step's gathers (communication memory, the
     * same pages each step), and whether gathers go to the window instead:
     * a whole-model gather that the save and evaluation read in place. */
    dt_slot_pool param_pool;
    int into_window;
    int backward;    /* stage 3: the layer being needed is for backward */
    /* hpZ: the group of consecutive ranks that hold the secondary
     * partition, and this rank's pieces of it (the working type). */
    dt_comm *hpz_comm;
    int hpz_k, hpz_me;
    void *sec;
    size_t sec_len;
    /* qgZ: the groups of its two hops, the host's ranks and the ranks of
     * this local index (NULL: one hop over comm), K and H (N and 1 then). */
    dt_comm *qgz_local, *qgz_cross;
    int qgz_k, qgz_h;
    /* Each traffic group's bytes (data-parallel, hpZ, qgZ) at the step's start. */
    zero_bytes at_begin[ZERO_GROUPS];
    FILE *events;    /* DTRAIN_ZERO_EVENTS: when each gather, reduce-scatter and layer ran */
    long step;
    /* The last step's figures. */
    double wait_ms;
    uint64_t bytes_sent;
} zero;

/* One line per event, "step event segment ns", for the tests that check
 * that communication overlaps compute. */
static inline void dt_zero_note(zero *z, const char *event, int s)
{
    if (z->events)
        fprintf(z->events, "%ld %s %d %llu\n", z->step, event, s, (unsigned long long)dt_now_ns());
}

/* --trace: a collective that ran on the progress thread from start to end. */
static inline void dt_zero_trace(const zero *z, const char *name, uint64_t start, uint64_t end,
                                 size_t bytes)
{
    dt_trace_args a = dt_trace_noargs();
    a.step = (int)z->step;
    a.bytes = (long long)bytes;
    if (start) dt_trace_add(DT_TRACE_COMM, name, start, end, &a);
}

/* Whether this rank has a piece of segment s (a pipeline stage holds some). */
static inline int dt_zero_has(const zero *z, int s) { return z->map.piece[s] > 0; }

/* Segment s of the layout: where it starts, and its floats. */
static inline size_t dt_zero_seg_lo(const zero *z, int s) { return dt_gpt_segment_start(z->m, s); }
static inline size_t dt_zero_seg_len(const zero *z, int s)
{
    return dt_gpt_segment_start(z->m, s + 1) - dt_gpt_segment_start(z->m, s);
}

/* ZeRO++ (qwZ, qgZ): the bytes of one rank's piece of segment s as a
 * packet of `bits`-bit values and block scales (kernels/quant.h). */
static inline size_t dt_zero_packet_bytes(const zero *z, int s, int bits)
{
    return dt_quant_packet_bytes(z->map.piece[s], (size_t)z->o.quant_block, bits);
}

/* zero_grads.c */
void dt_zero_grads_hook(zero *z); /* before each backward */
int dt_zero_grads_finish(zero *z); /* waits for every reduce-scatter, folds it in */
dt_gbuf dt_zero_grads_of(const zero *z, int s); /* this rank's piece of segment s */
void dt_zero_grads_free(zero *z);
/* Waits for *r (its time counts as exposed), traces it as `name` moving
 * `bytes`; *r = NULL. The request's return code. */
int dt_zero_wait(zero *z, dt_request **r, const char *name, size_t bytes);

/* zero_qgz.c: the groups of the two hops, or one hop (err: why not). */
int dt_zero_qgz_setup(zero *z, char *err, size_t n);
void dt_zero_qgz_free(zero *z);
/* Segment s's gradients g (the whole segment) quantized and on their way;
 * then this rank's averaged piece into out. 0, or -1 with z->error. */
int dt_zero_qgz_start(zero *z, int s, const float *g);
int dt_zero_qgz_finish(zero *z, int s, float *out);

/* zero_params.c */
int dt_zero_param_need(void *ctx, int s, int use);
void dt_zero_param_done(void *ctx, int s, int use);
/* The working parameters, what forward reads and the gathers fill: the
 * model's params (fp32), or params16 (mixed); and their element size. */
void *dt_zero_working(const zero *z);
/* Where segment s's gathered working values start (stage 3: its slot while
 * a step's gather holds it there, else its place in the window). */
char *dt_zero_seg_working(const zero *z, int s);
static inline size_t dt_zero_esz(const zero *z) { return z->mixed ? sizeof(uint16_t) : sizeof(float); }
/* After the pieces changed (the update, the start): with mixed precision
 * they are rounded to bf16 first; then stages 1-2 gather every segment,
 * stage 3 lets the stale windows go (persistent segments are gathered
 * again). */
int dt_zero_params_refresh(zero *z);
/* Every segment gathered for a writer of the whole model (stage 3's
 * working parameters; with mixed precision the fp32 master weights), or
 * all of that let go. */
int dt_zero_gather_all(zero *z);
int dt_zero_gather_one(zero *z, int s);
/* A deferred update (--offload-overlap) finished for every piece: before
 * the gradient pieces are written again. 0, or -1 with z->error. */
int dt_zero_settle_all(zero *z);
void dt_zero_release_one(zero *z, int s);
void dt_zero_drop_all(zero *z);
/* A failure of z's group (or of c) while doing `what`, kept in z->error
 * and the model's message; -1. */
int dt_zero_fail(zero *z, int rc, const char *what);
int dt_zero_fail_on(zero *z, dt_comm *c, int rc, const char *what);
/* Gives segment s of a window (the model's params, params16 or grads, of
 * esz-byte elements) back; when it was accounted, takes its bytes off the
 * account of `kind`. */
void dt_zero_drop_segment(zero *z, void *window, size_t esz, int s, dt_mem_kind kind,
                          int accounted);
/* Whether this rank keeps fp32 pieces of its own (stage 3, mixed
 * precision's masters): in shard_p, or in the optimizer's store. */
static inline int dt_zero_keeps_pieces(const zero *z) { return z->shard_p || z->o.offload_params; }
/* This rank's piece of segment s, from the fp32 parameter window into its
 * shard, or the store (offload_param). 0, or -1 with z->error. */
int dt_zero_keep_piece(zero *z, int s);
/* offload_param: every piece read ahead let go (the store still reading
 * into it waited for first). */
void dt_zero_free_pieces(zero *z);

#endif
