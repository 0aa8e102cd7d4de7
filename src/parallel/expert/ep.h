/* Expert parallelism (Megatron's) as a layer of the strategy stack: the
 * ranks of each expert-parallel group (mesh.h: ep consecutive data-
 * parallel ranks) hold E / ep experts of every mixture-of-experts layer
 * (model/split.h: dt_gpt_ep) and send each routing slot's row to the rank
 * of its expert and back (an all-to-all of counts, then of rows);
 * everything else is whole on every rank.
 *
 * Gradients: an expert's already holds every token of the group that
 * chose it (they came to it), so data parallelism (DDP or ZeRO, over the
 * replicas: the ranks of the same ep index) completes it; the other
 * tensors' gradients are each rank's own tokens', summed over the group
 * here as each segment becomes final, before the layer below sees it.
 * The rest is tensor parallelism's arithmetic (a rank's model is a slice
 * of the whole: S->whole, S->in_whole): the norm counts the whole tensors
 * on the group's first rank and each rank's experts on that rank;
 * checkpoints hold one shard per rank of the first replica; --save-final
 * gathers the experts onto the writer. */
#ifndef DT_PARALLEL_EXPERT_EP_H
#define DT_PARALLEL_EXPERT_EP_H

#include "parallel/mesh.h"
#include "parallel/registry.h"

/* Adds the layer for this rank's place in g (its ep group formed). */
int dt_ep_layer(dt_strategy *S, const dt_mesh *g);

/* What rank q of a group of ep holds of layout's model (its experts, the
 * whole tensors, its activations for B x T): for the memory plans. 0, or
 * -1 with err (experts that do not split). */
int dt_ep_rank_mem(const dt_gpt *layout, int q, int ep, int B, int T, dt_rank_mem *out,
                   char *err, size_t errlen);

#endif
