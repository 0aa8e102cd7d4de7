/* ZeRO (stages 1-3, FSDP at stage 3) over the data-parallel ranks: the
 * optimizer state (1), then the gradients (2), then the parameters (3) are
 * split into equal pieces of every segment (shard_map.h) instead of being
 * held whole on every rank.
 *
 *   stage 1: gradients reduce-scattered as backward finishes each segment
 *            (on the step's last micro-batch), each rank updates its
 *            pieces, the parameters are all-gathered segment by segment;
 *   stage 2: the same, but every micro-batch's gradients are
 *            reduce-scattered and only this rank's pieces are kept (they
 *            accumulate); the full gradient buffer is a window whose pages
 *            are given back once each segment is reduced;
 *   stage 3: the parameters live as pieces too; each segment is gathered
 *            just before its forward and again before its backward and let
 *            go after, the next `prefetch` segments gathered ahead.
 *
 * With mixed precision (the model's params16, gpt.h) the working
 * parameters are bf16 at every stage and the fp32 masters are pieces of
 * the optimizer state: each rank updates its pieces, rounds them, and the
 * gathers move bf16. Gradients go through a bf16 copy when o.wire says.
 *
 * Below a pipeline (pipeline.h), ZeRO-1 splits each held segment over the
 * stage's data-parallel group: the segments a stage does not hold have no
 * pieces at all.
 *
 * Same data and order of operations as DDP: with a reduce-scatter that
 * sums in rank order (`direct`) against DDP's `naive` all-reduce, or at 2
 * ranks with any algorithms (a + b = b + a), the weights are the same bits.
 * Stages 2-3 with gradient accumulation reduce each micro-batch before
 * adding them up, where DDP adds first: the same sums in another order. */
#ifndef DT_PARALLEL_ZERO_H
#define DT_PARALLEL_ZERO_H

#include <stddef.h>

#include "parallel/strategy.h"

typedef struct {
    int stage;           /* 1, 2 or 3 */
    int prefetch;        /* stage 3: segments gathered ahead of use */
    size_t prefetch_floats; /* stage 3: or as many as fit in this many floats (0: by count) */
    int reshard_after_forward; /* stage 3: let a layer go after its forward (1) or keep it for backward (0) */
    size_t persist_floats; /* stage 3: segments up to this size stay gathered */
    size_t max_live_floats; /* stage 3: prefetch stops at this many gathered floats (0: no limit) */
    dt_dtype wire;       /* gradients reduce-scattered in DT_F32 or DT_BF16 (parallel/wire.h) */
    int quant_weights;   /* stage 3: ZeRO++'s qwZ, the parameters' gathers in int8 */
    int quant_block;     /* qwZ, qgZ: values per fp32 scale */
    int quant_grads;     /* stage 3: ZeRO++'s qgZ, gradients reduce-scattered as quantized
                          * blocks through all-to-alls, in the host then across hosts */
    int grad_bits;       /* qgZ: 8 or 4 bits a value */
    int defer_update;    /* stage 3, optimizer on NVMe: each piece's update runs just before
                          * its next gather, its disk reads behind the layers before it */
    int hpz;             /* stage 3: ZeRO++'s hpZ, a second copy of the parameters sharded over
                          * groups of this many consecutive ranks (a host's), which backward
                          * gathers from; 1 = none */
    int offload_params;  /* stage 3, fp32: the pieces live in the optimizer's NVMe store, each
                          * read just ahead of its gather (ZeRO-Infinity's offload_param) */
} dt_zero_opts;

/* Adds ZeRO over the job's ranks to S. 0, or -1 with S->rank->err. */
int dt_zero_strategy(dt_strategy *S, const dt_zero_opts *o);

/* The same over `group` (a pipeline stage's data-parallel ranks; destroyed
 * with the layer when owns): ZeRO splits only what the layers above it
 * left this rank (S->held, S->owned), each held segment into pieces over
 * the group. Stage 1 only where a layer above holds part of the model. */
int dt_zero_strategy_on(dt_strategy *S, dt_comm *group, int owns, const dt_zero_opts *o);

#endif
