/* Pipeline parallelism as a strategy layer: the model cut into stages of
 * consecutive layers (partition.h), one stage (or, interleaved, one chunk
 * of V) per rank of a pipeline group, a schedule's action lists
 * (schedule.h) run by the executor (executor.h) for each step. With more
 * ranks than stages the job is pp x dp: rank = stage * dp + dp index
 * (Megatron's order), each stage's gradients averaged by DDP over its
 * data-parallel group. The tied embedding lives on the first stage and, as
 * the output head, on the last; their gradients are summed before the
 * update, which both then apply alike (Megatron's embedding group). */
#ifndef DT_PARALLEL_PIPELINE_PIPELINE_H
#define DT_PARALLEL_PIPELINE_PIPELINE_H

#include "parallel/pipeline/schedule.h"
#include "parallel/registry.h"

/* Checks a pipeline configuration for a job of `world` ranks without
 * building anything: --pp divides the job, the schedule builds for p, V
 * and M (= micro-batches, --grad-accum), and its static check passes.
 * *dp: the data-parallel size. 0, or -1 with err saying what would work. */
int dt_pp_check(const dt_parallel_opts *o, int world, int accum, int *dp, char *err,
                size_t errlen);

/* The same, keeping the schedule it built in *sched (free it with
 * dt_pp_schedule_free): for a plan of the pipeline's memory. */
int dt_pp_check_schedule(const dt_parallel_opts *o, int world, int accum, int *dp,
                         dt_pp_schedule *sched, char *err, size_t errlen);

/* Adds this rank's layers: DDP over its stage's data-parallel group when
 * there is one, then the pipeline. 0, or -1 with S->rank->err. */
int dt_pp_strategy(dt_strategy *S, const dt_parallel_opts *o);

#endif
