/* ZeRO's state, shared by its files: zero.c (the strategy's hooks),
 * zero_grads.c (the gradients' reduce-scatter during backward),
 * zero_params.c (the parameters' gathers). Private to parallel/zero. */
#ifndef DT_PARALLEL_ZERO_INTERNAL_H
#define DT_PARALLEL_ZERO_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "core/alloc.h"
#include "core/timer.h"

#include "parallel/strategy.h"
#include "parallel/zero/shard_map.h"
#include "parallel/zero/zero.h"

typedef struct {
    dt_request *rs;    /* its gradients' reduce-scatter, in flight */
    dt_request *ag;    /* its parameters' gather, in flight (stage 3, or 1-2 after the update) */
    int gathered;      /* stage 3: the window holds it (or a gather is on its way) */
    int grads_held;    /* stages 2-3: its gradient window is accounted */
    int persistent;    /* stage 3: small enough to stay gathered */
} zero_seg;

typedef struct zero {
    dt_strategy *S;
    dt_comm *comm;
    dt_zero_opts o;
    dt_gpt *m;
    dt_shard_map map;
    dt_flat_ranges ranges; /* the map's, as the trainer sees them (S->shard) */
    zero_seg *seg;
    int nseg, L;
    float *shard_p;  /* stage 3: this rank's pieces of the parameters */
    float *shard_g;  /* stages 2-3: this rank's pieces of the gradients */
    int window_p, window_g; /* the model's params / grads are windows (core/window.h) */
    int micro, last; /* the micro-batch whose backward runs */
    int in_head;     /* forward has reached the output head */
    int inited;      /* stage 3: the initialisation went piece by piece */
    int error;       /* a failure inside a model hook (reported at the step's end) */
    char errmsg[256];
    size_t live;     /* stage 3: floats gathered now */
    FILE *events;    /* DTRAIN_ZERO_EVENTS: when each gather, reduce-scatter and layer ran */
    long step;
    /* The last step's figures. */
    double wait_ms;
    uint64_t bytes_at_begin, bytes_sent;
} zero;

/* One line per event, "step event segment ns", for the tests that check
 * that communication overlaps compute. */
static inline void dt_zero_note(zero *z, const char *event, int s)
{
    if (z->events)
        fprintf(z->events, "%ld %s %d %llu\n", z->step, event, s, (unsigned long long)dt_now_ns());
}

/* Segment s of the layout: where it starts, and its floats. */
static inline size_t dt_zero_seg_lo(const zero *z, int s) { return dt_gpt_segment_start(z->m, s); }
static inline size_t dt_zero_seg_len(const zero *z, int s)
{
    return dt_gpt_segment_start(z->m, s + 1) - dt_gpt_segment_start(z->m, s);
}

/* zero_grads.c */
void dt_zero_grads_hook(zero *z); /* before each backward */
int dt_zero_grads_finish(zero *z); /* waits for every reduce-scatter, folds it in */
const float *dt_zero_grads_of(const zero *z, int s); /* this rank's piece of segment s */
void dt_zero_grads_free(zero *z);

/* zero_params.c */
int dt_zero_param_need(void *ctx, int s, int use);
void dt_zero_param_done(void *ctx, int s, int use);
float *dt_zero_params_of(const zero *z, int s); /* this rank's piece, where the update writes it */
/* After the update: stages 1-2 gather every segment; stage 3 lets the
 * stale windows go (persistent segments are gathered again). */
int dt_zero_params_refresh(zero *z);
/* Stage 3: gathers every segment (for a writer), or lets all go. */
int dt_zero_gather_all(zero *z);
int dt_zero_gather_one(zero *z, int s);
void dt_zero_release_one(zero *z, int s);
void dt_zero_drop_all(zero *z);
int dt_zero_fail(zero *z, int rc, const char *what);
/* Gives segment s of a window (the model's params or grads) back; when
 * it was accounted, takes its bytes off the account of `kind`. */
void dt_zero_drop_segment(zero *z, float *window, int s, dt_mem_kind kind, int accounted);
/* Stage 3: this rank's piece of segment s, from the parameter window into
 * its shard. */
void dt_zero_keep_piece(zero *z, int s);

#endif
