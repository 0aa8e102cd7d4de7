/* The job's ranks as a grid, for strategies that split the model or the
 * sequence as well as the batch: tensor parallelism (tp), context
 * parallelism (cp), data parallelism (dp) and pipeline parallelism (pp),
 * ranks = tp x cp x dp x pp.
 *
 * Megatron's order: rank r sits at tp_i = r % tp, cp_i = (r / tp) % cp,
 * dp_i = (r / (tp cp)) % dp, pp_i = r / (tp cp dp). The tensor-parallel
 * ranks are adjacent, so a group shares a host (its reduces run in every
 * layer), then the context-parallel ones; a pipeline's stages, which
 * exchange one activation per micro-batch, are furthest apart.
 *
 * Groups, each formed with dt_comm_split (NULL where it would hold one
 * rank):
 *   tp_group   the slices of one model: same cp_i, dp_i, pp_i
 *   cp_group   the rows of one set of sequences: same tp_i, dp_i, pp_i
 *   dp_group   the blocks of the global batch, which evaluate different
 *              validation batches: same tp_i, cp_i, pp_i
 *   pp_group   one pipeline's stages: same tp_i, cp_i, dp_i
 *   replicas   every rank that holds the same parameters, over which the
 *              gradients are averaged: same tp_i and pp_i (cp x dp ranks:
 *              context parallelism's ranks see other tokens of the same
 *              sequences, so for the gradients they are data-parallel)
 *   tied       the first and last stage of a pipeline (the tied embedding
 *              and its copy as the output head)
 *   writers    the ranks of replica index 0, which write a checkpoint's
 *              shards where no ZeRO layer splits them further
 *
 * dt_mesh_strategy builds, for --strategy ddp with --tp, --cp or --pp, the
 * stack from the bottom: the mesh itself (it owns the groups, says who
 * evaluates together and, planning last, who writes), DDP or ZeRO over the
 * replicas, context parallelism, the pipeline, tensor parallelism. Each
 * layer narrows what the ones above it left (strategy.h); none knows
 * which others are there. With --ep the expert-parallel layer sits
 * between the pipeline and tensor parallelism: it plans after tp (whose
 * whole layout it takes), gathers the final weights before it (over the
 * tp x ep ranks of replica 0, `slices`), and its gradient hook wraps the
 * data-parallel layer's. */
#ifndef DT_PARALLEL_MESH_H
#define DT_PARALLEL_MESH_H

#include "parallel/registry.h"

/* Expert parallelism (ep, Megatron's) splits the data-parallel axis: the
 * ep consecutive dp ranks dp_i = ep_i + ep edp_i each hold E / ep experts
 * of every mixture-of-experts layer and exchange their tokens' rows;
 *   ep_group   one set of the experts: same tp_i, cp_i, pp_i, edp_i
 *   edp_group  the ranks that hold the same experts and evaluate
 *              different validation batches: same tp_i, cp_i, pp_i, ep_i
 * and the replicas (the same parameters) are then the cp x dp / ep ranks
 * of one ep_i. */
typedef struct {
    int tp, cp, dp, pp, ep;           /* sizes; ep divides dp */
    int tp_i, cp_i, dp_i, pp_i, ep_i; /* this rank's place */
    dt_comm *tp_group, *cp_group, *dp_group, *pp_group, *replicas, *tied, *writers;
    dt_comm *ep_group, *edp_group;
    dt_comm *slices; /* with ep: the tp x ep ranks of replica 0 on stage 0, rank tp_i + tp
                      * ep_i, which bring their slices and experts to one writer */
} dt_mesh;

/* Checks a job of `world` ranks against --tp, --cp and --pp (and what
 * they cannot be combined with); *dp = world / (tp cp pp). 0, or -1 with a
 * message naming the sizes and what would work. */
int dt_mesh_check(const dt_parallel_opts *o, int world, int *dp, char *err, size_t errlen);

/* What each (pipeline stage, tensor slice) of such a job holds, stage by
 * stage (places.h; mesh_places.c): a place is the cp x dp ranks there,
 * ZeRO shards over them. The layout gains no state (its rows are set on a
 * copy). 0, or -1 with err naming the sizes that do not split. */
int dt_mesh_places(const dt_places_job *job, dt_places *out, char *err, size_t errlen);

/* This rank's layers for --tp / --cp / --pp (see above). */
int dt_mesh_strategy(dt_strategy *S, const dt_parallel_opts *o);

/* The index of this rank's replica among the cp x dp ranks that hold the
 * same parameters: 0 for the ranks that write checkpoints and gather the
 * final weights. */
int dt_mesh_replica_index(const dt_mesh *g);

/* Rank r's place: tp_i, cp_i, dp_i, pp_i in at[0..3]. */
void dt_mesh_coords(const dt_mesh *g, int r, int at[4]);

/* The banner's lines (mesh_print.c): the sizes, the ranks of each axis's
 * groups (the first few where there are many), and which ranks run on
 * which host, with a note where a tensor-parallel group spans hosts.
 * hosts: each rank's host name, DT_MESH_HOST_NAME bytes apart. */
#define DT_MESH_HOST_NAME 64
void dt_mesh_print(const dt_mesh *g, const char *hosts, FILE *f);

#endif
