/* Pipeline parallelism as a strategy layer: the model cut into stages of
 * consecutive layers (partition.h), one stage (or, interleaved, one chunk
 * of V) per rank of a pipeline group, a schedule's action lists
 * (schedule.h) run by the executor (executor.h) for each step. The mesh
 * (parallel/mesh.h) places the stages outermost, rank = stage x (tp cp
 * dp) + the rest (Megatron's order), and averages each stage's gradients
 * over its replicas; a stage's rank exchanges its own rows (its slices'
 * copy, its context-parallel rows, its sequence-parallel share) with the
 * same place of the next stage. The tied embedding lives on the first stage and, as
 * the output head, on the last; their gradients are summed before the
 * update, which both then apply alike (Megatron's embedding group). */
#ifndef DT_PARALLEL_PIPELINE_PIPELINE_H
#define DT_PARALLEL_PIPELINE_PIPELINE_H

#include "parallel/mesh.h"
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

/* Adds the pipeline layer for this rank's place in the mesh g (its
 * pipeline and tied groups formed; the data parallelism within a stage is
 * the mesh's). 0, or -1 with S->rank->err. */
int dt_pp_layer(dt_strategy *S, const dt_mesh *g, const dt_parallel_opts *o);

#endif
