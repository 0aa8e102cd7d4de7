/* The job's ranks as a grid, for strategies that split the model or the
 * sequence as well as the batch: tensor parallelism (tp), context
 * parallelism (cp) and data parallelism (dp), ranks = tp x cp x dp.
 *
 * Rank r sits at tp_i = r % tp, cp_i = (r / tp) % cp, dp_i = r / (tp cp):
 * the tensor-parallel ranks are adjacent, so a group shares a host (its
 * reduces run in every layer), then the context-parallel ones.
 *
 * Groups, each formed with dt_comm_split (NULL where it would hold one
 * rank):
 *   tp_group   same cp_i, dp_i: the slices of one model
 *   cp_group   same tp_i, dp_i: the rows of one set of sequences
 *   dp_group   same tp_i, cp_i: the blocks of the global batch, which
 *              evaluate different validation batches
 *   replicas   same tp_i: every rank that holds the same parameters, over
 *              which the gradients are averaged (cp x dp ranks: context
 *              parallelism's ranks see different tokens of the same
 *              sequences, so for the gradients they are data-parallel)
 *
 * dt_mesh_strategy adds, for --strategy ddp with --tp or --cp: DDP or
 * ZeRO-1 over the replicas, then context parallelism, then tensor
 * parallelism, then the mesh itself (it owns the groups and says who
 * evaluates together). */
#ifndef DT_PARALLEL_MESH_H
#define DT_PARALLEL_MESH_H

#include "parallel/registry.h"

typedef struct {
    int tp, cp, dp;       /* sizes */
    int tp_i, cp_i, dp_i; /* this rank's place */
    dt_comm *tp_group, *cp_group, *dp_group, *replicas;
} dt_mesh;

/* Checks a job of `world` ranks against --tp and --cp (and what they
 * cannot be combined with yet); *dp = world / (tp cp). 0, or -1 with a
 * message naming the sizes and what would work. */
int dt_mesh_check(const dt_parallel_opts *o, int world, int *dp, char *err, size_t errlen);

/* This rank's layers for --tp / --cp (see above). */
int dt_mesh_strategy(dt_strategy *S, const dt_parallel_opts *o);

/* The index of this rank's replica group among cp x dp: 0 for the ranks
 * that write checkpoints and gather the final weights. */
int dt_mesh_replica_index(const dt_mesh *g);

#endif
