/* What the pieces of a pipeline stage cost to run, measured: the input to
 * `--pp-partition cost` (partition.h balances the stages by it).
 *
 * A throwaway model of the run's sizes (width, heads, vocabulary, block
 * size, precision, mixed precision, bf16 gradient accumulation and
 * recompute mode) but 3 layers, with one activation slot for each of the
 * parts {0,1}, {1,2} and {2,3}, runs forward and backward of a micro-batch
 * of B x T random tokens (a fixed seed) through the three parts in a row,
 * as a pipeline's stages would (each part's output is the next one's
 * input, each input's gradient the previous part's output gradient). The
 * kernels run on the caller's thread with the thread count the trainer set
 * (kernels/threads.h). One warm-up pass, then per part the minimum over
 * as many passes as fit in DT_PP_COST_BUDGET_S seconds: at least one (a
 * large vocabulary makes the head slow), at most DT_PP_COST_MAX_REPS:
 *   layer = t{1,2}
 *   embed = t{0,1} - layer   (the embeddings and their gradient)
 *   head  = t{2,3} - layer   (final LayerNorm, tied head, loss)
 * each difference clamped at 0 (noise can make it negative).
 *
 * Everything is freed before returning; the memory accounting
 * (core/alloc.h) is back where it was, its peaks included (the throwaway
 * model is not part of what the run holds). One exception: the per-thread
 * matmul workspace (kernels) that the products allocate on first use
 * stays, as it would for the run's own first step. */
#ifndef DT_PARALLEL_PIPELINE_PARTITION_COST_H
#define DT_PARALLEL_PIPELINE_PARTITION_COST_H

#include <stddef.h>

#include "model/gpt.h"

#define DT_PP_COST_MAX_REPS 20
#define DT_PP_COST_BUDGET_S 2.0

typedef struct {
    double embed_ms, layer_ms, head_ms; /* forward + backward of one micro-batch */
} dt_pp_costs;

/* Measures the costs for micro-batches of B x T on a model like `like`
 * (its configuration and modes; its buffers are not touched, it may be a
 * layout without any). 0, or -1 with err. */
int dt_pp_measure_costs(const dt_gpt *like, int B, int T, dt_pp_costs *out, char *err,
                        size_t errlen);

#endif
