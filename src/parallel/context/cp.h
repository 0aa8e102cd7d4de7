/* Context parallelism (Megatron's --context-parallel-size) as a layer of
 * the strategy stack: the ranks of a cp group each run the whole model on
 * their rows of every sequence (model/split.h: dt_gpt_cp), and attention
 * looks across the group by ring attention or DeepSpeed-Ulysses (this
 * folder). The ranks hold the whole parameters; their gradients are
 * averaged with the data-parallel ones over the mesh's replicas
 * (parallel/mesh.h), since for the gradients a rank's rows are just other
 * tokens of the batch.
 *
 * Sharding: ring attention cuts each sequence zig-zag (rank r holds chunks
 * r and 2N-1-r of 2N, so every rank has the same causal work; T must be a
 * multiple of 2N); Ulysses contiguously (rank r holds chunk r of N: its
 * attention runs over whole sequences of NH / N heads, the same work on
 * every rank whatever the cut; heads a multiple of N). */
#ifndef DT_PARALLEL_CONTEXT_CP_H
#define DT_PARALLEL_CONTEXT_CP_H

#include "parallel/mesh.h"

/* Adds the layer for this rank's place in g (its cp group formed), with
 * o->cp_algo's attention. 0, or -1 with S->rank->err. */
int dt_cp_layer(dt_strategy *S, const dt_mesh *g, const dt_parallel_opts *o);

/* How --cp-algo `algo` cuts the sequence, and what its attention keeps
 * (dt_gpt_cp's saved_widths): for dt_gpt_set_cp, a run's or a plan's. */
void dt_cp_algo_shape(const char *algo, dt_shard_kind *kind, int *saved_widths);

#endif
