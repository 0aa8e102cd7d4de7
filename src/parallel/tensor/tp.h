/* Tensor parallelism (Megatron's) as a layer of the strategy stack: the
 * ranks of each tensor-parallel group hold slices of every matrix of the
 * model (model/split.h: dt_gpt_tp) and sum the partial products over the
 * group; data parallelism (DDP or ZeRO-1) runs over the ranks that hold
 * the same slices (the mesh's replicas, parallel/mesh.h).
 *
 * What the layer says about a rank (strategy.h): its model is a slice, so
 * checkpoints, --init and --save-final go through the whole model's layout
 * (S->whole, S->in_whole); the gradients of the split tensors are counted
 * in the norm by every rank of the group, those of the whole tensors by
 * the group's first rank alone (they are the same bits on every rank);
 * checkpoints are written as one shard per slice by the first replica
 * group's ranks. */
#ifndef DT_PARALLEL_TENSOR_TP_H
#define DT_PARALLEL_TENSOR_TP_H

#include "parallel/mesh.h"
#include "parallel/registry.h"

/* Adds the layer for this rank's place in g (its tp group formed), with
 * sequence parallelism when sp. */
int dt_tp_layer(dt_strategy *S, const dt_mesh *g, int sp);

/* What rank q of a group of tp holds of layout's model (its slices, the
 * whole tensors, its activations for B x T): for the memory plans, a
 * run's and --dry-run's. 0, or -1 with err (sizes that do not split). */
int dt_tp_rank_mem(const dt_gpt *layout, int q, int tp, int B, int T, dt_rank_mem *out,
                   char *err, size_t errlen);

/* The model's reduce (dt_gpt_tp.reduce) over the communicator ctx: sums
 * (fp32 or fp64) or maxima, in place. */
int dt_tp_reduce(void *comm, void *buf, size_t n, dt_tp_op op, char *err, size_t errlen);

#endif
