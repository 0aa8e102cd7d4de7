/* What one data-parallel rank should hold, by the ZeRO formulas, so that
 * the bytes a run accounts (core/alloc.h) can be checked against them, and
 * so that `dtrain train --dry-run` can say what any model needs without
 * building it. Pure arithmetic over the layout: it allocates no model
 * buffer.
 *
 * With Psi the model's parameter count (dt_gpt_param_count, without the
 * layout's alignment padding) and N the data-parallel ranks, each rank
 * holds, in bytes:
 *
 *                  params        grads         optimizer state
 *   stage 0 (DDP)  P Psi         G Psi         K Psi
 *   stage 1        P Psi         G Psi         K Psi / N
 *   stage 2        P Psi         G Psi / N     K Psi / N
 *   stage 3        P Psi / N     G Psi / N     K Psi / N
 *
 * fp32:        P = 4, G = 4; K = 8 for Adam/AdamW (two fp32 moments), 4 for
 *              SGD with momentum, 0 for plain SGD.
 * bf16 (mixed precision): P = 2 (bf16 working parameters), G = 4 when
 *              gradients accumulate in fp32 (the default), 2 in bf16; the
 *              optimizer keeps fp32 master weights besides its moments:
 *              K = 12 for Adam/AdamW, 8 for SGD with momentum, 4 without.
 * So with Adam in bf16 and bf16 gradients the classic table: DDP
 * (2 + 2 + K) Psi, ZeRO-1 (2 + 2) Psi + K Psi / N, ZeRO-2 2 Psi + (2 + K)
 * Psi / N, ZeRO-3 (2 + 2 + K) Psi / N.
 *
 * Not in the formula, reported beside it as bounds: stage 2 keeps a
 * gradient segment whole while backward produces it (up to the largest
 * segment of the layout, G bytes each); stage 3 also gathers the
 * parameters of up to prefetch + 1 segments at once (P bytes each); whole
 * gradients accumulated over micro-batches (bf16, or fp32 beyond the first
 * micro-batch) hold the segments backward has open in fp32 apart; mixed
 * precision widens the segments in use into fp32 (a layer, or at the head
 * the embeddings with the final norm, 4 bytes each). Real buffers are
 * padded (64-byte tensor alignment, equal shards), so a measured figure
 * sits slightly above the formula.
 *
 * Activations: dt_gpt_acts_floats(layout, B, T) floats of 4 bytes, the
 * arena the model carves for one micro-batch (it follows the layout's
 * recomputation mode); the same on every stage. */
#ifndef DT_TRAIN_MEMORY_PLAN_H
#define DT_TRAIN_MEMORY_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "core/alloc.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "train/config/config.h"

typedef struct {
    int zero_stage;    /* 0 (DDP) to 3 */
    int ranks;         /* N, data-parallel ranks the state is sharded over; >= 1 */
    dt_precision prec; /* DT_PREC_F32, or DT_PREC_BF16 for mixed precision */
    int grads_bf16;    /* mixed precision: gradients accumulate in bf16 (G = 2) */
    dt_opt_kind opt;
    double momentum;   /* SGD: 0 keeps no state */
    int B, T;          /* the micro-batch */
    int accum;         /* micro-batches a step: beyond one, fp32 accumulation forms each
                        * later one's gradients apart (model/gpt.h), a segment at a time */
    int prefetch;      /* stage 3: segments gathered ahead of the one in use */
    const dt_offload_opts *offload; /* the optimizer state on NVMe; NULL: in memory */
    int offload_params; /* stage 3: the parameters' pieces on NVMe too (offload_param) */
    int hpz;            /* stage 3: hpZ's group size K (a second copy, P Psi / K); 1: none */
    size_t psi;         /* the floats this rank's model holds (a tensor-parallel rank's
                         * slices, padding included); 0: the model's parameters */
} dt_mem_plan_opts;

typedef struct {
    dt_mem_plan_opts o;
    size_t psi;                /* parameters */
    int param_bytes, grad_bytes, optim_bytes; /* P, G, K per parameter */
    /* Per rank, by dt_mem_kind: params, grads, optim by the formula, acts
     * the estimate; the other kinds 0. */
    double bytes[DT_MEM_KIND_COUNT];
    char formula[DT_MEM_KIND_COUNT][24]; /* "4 Psi / N"; "" where none */
    double window_params, window_grads; /* transient bounds above the formula */
    double window_widened; /* mixed precision: fp32 copies of the segments in use */
    double nvme;           /* offload: the optimizer state's bytes in the rank's file */
    double nvme_params;    /* offload_param: the parameters' pieces' bytes there */
} dt_mem_plan;

/* The plan for a model's layout (dt_gpt_create_layout is enough). 0, or -1
 * with a message naming the bad input (stage outside 0-3, N < 1, an empty
 * or too long micro-batch, an unknown precision). */
int dt_mem_plan_make(const dt_gpt *layout, const dt_mem_plan_opts *o, dt_mem_plan *p, char *err,
                     size_t errlen);

/* The options of a validated training configuration over `ranks`
 * data-parallel ranks, then the plan. 0 or -1 with a message. */
int dt_mem_plan_from_config(const dt_gpt *layout, const dt_train_config *c, int ranks,
                            dt_mem_plan *p, char *err, size_t errlen);
/* The same for a rank whose model holds `psi` floats (its slices). */
int dt_mem_plan_from_config_psi(const dt_gpt *layout, const dt_train_config *c, int ranks,
                                size_t psi, dt_mem_plan *p, char *err, size_t errlen);

/* The optimizer's moments on NVMe (o): of `share` parameters (the rank's),
 * whose state is n floats; memory holds the stream's buffers. */
void dt_mem_plan_offload(dt_mem_plan *p, const dt_offload_opts *o, double share, size_t n);

/* Model state by the formula: params + grads + optim. */
double dt_mem_plan_state(const dt_mem_plan *p);

/* The table: a line naming the setting (model name, Psi, precision,
 * optimizer and K, stage, N), then a column per kind (params, grads,
 * optim, model state, acts) with the formula and its figure, then, when
 * measured is given, one row per rank: that rank's bytes by kind (nrows
 * snapshots of DT_MEM_SNAPSHOT values, as train/metrics.h takes them) and
 * each kind's ratio to the formula, and its peak RSS. The transient
 * windows come last, where the stage has any. */
void dt_mem_plan_print(FILE *f, const dt_mem_plan *p, const char *title,
                       const unsigned long long *measured, int nrows);

#endif
