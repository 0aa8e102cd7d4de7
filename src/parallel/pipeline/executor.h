/* The pipeline executor: runs one rank's action list (schedule.h) for an
 * optimizer step over the pipeline group's point-to-point messages. It
 * holds each micro-batch in flight in an activation slot of the model
 * (gpt.h), as many per model chunk as the list ever keeps in flight, and
 * knows nothing of which schedule made the list. */
#ifndef DT_PARALLEL_PIPELINE_EXECUTOR_H
#define DT_PARALLEL_PIPELINE_EXECUTOR_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"
#include "model/gpt.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/strategy.h"

typedef struct {
    dt_comm *comm;                /* the pipeline group; rank r holds stages r, r + p, ... */
    const dt_pp_schedule *sched;
    const int *cut;               /* [S + 1]: the first layer of each stage */
    int me, p, V, S, M;           /* this rank in the group; ranks, chunks, stages, micro-batches */
    dt_gpt *model;
    int B, T;
    size_t msg;                   /* floats of an activation or its gradient between stages:
                                   * this rank's rows (dt_gpt_boundary_floats) */
    int nslots;
    int slot_base[64], slot_count[64]; /* per chunk of this rank (V <= 64) */
    int *slot_of;                 /* [V * M]: the slot holding (chunk, micro), or -1 */
    unsigned char *slot_busy;     /* [nslots] */
    int32_t *tokens, *targets;    /* [nslots][B * T] */
    float *dout;                  /* [nslots][msg]: the output's gradient, received */
    dt_request **sreq;            /* [nslots]: a send from the slot still in flight */
    dt_pp_action *sent;           /* [nslots]: what it carries, for the trace */
    uint64_t *sent_ns;            /* [nslots]: when it was posted */
    unsigned char *last;          /* [list length]: whether the action is its micro-batch's
                                     last on the chunk, its stage's last B or W (flags) */
    /* Of the last step. */
    double wait_ms;               /* blocked on receives */
    uint64_t bytes;               /* sent */
    char err[320];
} dt_pp_exec;

/* The slots each chunk of rank `me` needs: the most micro-batches its
 * list holds between a forward and the matching backward (or weight
 * gradient). parts[k] the part of slot k, chunk by chunk; returns the
 * count, at most `cap`, or -1. */
int dt_pp_exec_slots(const dt_pp_schedule *s, int me, const int *cut, dt_gpt_part *parts,
                     int cap);

/* After the model's slots exist (from dt_pp_exec_slots' parts). 0, or -1
 * with x->err. */
int dt_pp_exec_init(dt_pp_exec *x, dt_comm *comm, const dt_pp_schedule *s, const int *cut,
                    dt_gpt *m, int B, int T);
void dt_pp_exec_free(dt_pp_exec *x);

/* One step's micro-batches: this rank's list, from training position
 * `first` (micro-batch i is sequences first + i B ...), gradients scaled
 * for the mean over B T M tokens, layers of S told before each backward.
 * *loss_sum: the sum of the micro-batches' mean losses on the rank
 * holding the head, 0 elsewhere. 0, or -1 with x->err. */
int dt_pp_exec_step(dt_pp_exec *x, dt_strategy *S, uint64_t first, double *loss_sum);

/* A forward of one batch through every stage (evaluation): the mean loss
 * on the rank holding the head. 0, or -1 with x->err. */
int dt_pp_exec_forward(dt_pp_exec *x, const int32_t *tokens, const int32_t *targets, int b,
                       double *loss);

#endif
