/* The worker side of the parameter server (see ps.h): pushes as backward
 * finishes each piece, then pulls. Every call talks to all S servers over
 * the worker's own link. */
#ifndef DT_PARALLEL_PS_WORKER_H
#define DT_PARALLEL_PS_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/ps.h"

typedef struct {
    dt_ps *ps;
    dt_gpt *model;
    dt_comm *link;
    long step;             /* the step being pushed */
    int communicate;       /* this backward pushes (the last micro-batch of a step) */
    int next_piece;        /* pieces pushed so far in this backward */
    dt_request **pushes;   /* per piece, in flight or NULL */
    unsigned char *encoded; /* per piece at enc_off[p]: the compressed push */
    size_t *enc_off;
    float *residual;       /* error feedback over the whole gradient, or NULL */
    int error;             /* first failure inside backward */
    /* Measured over the last step. */
    double wait_ms;        /* from the end of backward to the new parameters: not hidden */
    uint64_t bytes_sent;   /* payload pushed */
    double norm;           /* gradient norm the update clipped with */
} dt_ps_worker;

int dt_ps_worker_init(dt_ps_worker *w, dt_ps *ps, dt_gpt *m, char *err, size_t errlen);
void dt_ps_worker_free(dt_ps_worker *w);

/* Worker 0, at the start: hands every server its shard of the parameters,
 * and of the optimizer's state when o is not NULL (a resumed run). */
int dt_ps_worker_init_servers(dt_ps_worker *w, const dt_optimizer *o, long step);

/* A step: announce it, then begin_backward before each micro-batch's
 * backward (only the last pushes), then finish: waits for the pushes, sends
 * the trailer (the local gradient's sum of squares, which asynchronous
 * servers clip with) and receives the updated parameters into the model. */
int dt_ps_worker_begin_step(dt_ps_worker *w, long step);
void dt_ps_worker_begin_backward(dt_ps_worker *w, int communicate);
int dt_ps_worker_finish(dt_ps_worker *w);

/* The servers' current parameters into the model. */
int dt_ps_worker_pull(dt_ps_worker *w);
/* The servers' parameters into the model and their optimizer state into o
 * (which covers the whole layout), for a checkpoint. */
int dt_ps_worker_fetch(dt_ps_worker *w, dt_optimizer *o);
/* Tells every server that this worker pushes no more steps (it may still
 * pull and fetch). */
int dt_ps_worker_done(dt_ps_worker *w);
/* Tells every server that this worker is done. */
int dt_ps_worker_stop(dt_ps_worker *w);

#endif
