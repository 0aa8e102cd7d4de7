/*
 * Collectives over groups of ranks: the world cut into groups of n ranks
 * each (all tensor-parallel groups, or all replicas of the stages), every
 * group running the same collective at its own pace.
 *
 * A collective is recorded (sim/coll.h) on a stand-in world of the
 * group's n members whose host map is the members' hosts, so the
 * algorithm and its links are those the real sub-communicator would have;
 * the engine maps member indices to world ranks as it posts the ops.
 * Groups whose members sit alike on hosts (the same pattern of "which
 * members share a host", hosts numbered by first appearance) have the same
 * shape and share one recording: on a regular mesh all tensor-parallel
 * groups are one shape, and recording costs one group, not the world.
 */
#ifndef DT_SIM_GROUP_H
#define DT_SIM_GROUP_H

#include <stddef.h>

#include "sim/coll.h"
#include "sim/world.h"

typedef struct {
    int n, ngroups;  /* members per group; groups (n x ngroups = the world) */
    int *members;    /* [ranks] group g's members at members[g n .. g n + n) */
    int *pos;        /* [ranks] rank r sits at members[pos[r]] */
    int *shape;      /* [ngroups] which recording group g plays */
    int nshapes;
    int *rep;        /* [nshapes] a group of each shape */
} dt_sim_groups;

/* The partition whose group g has member i at rank member(ctx, g, i);
 * every rank must appear once. 0, or -1 with a message. */
int dt_sim_groups_init(dt_sim_groups *g, const dt_sim_world *w, int n,
                       int (*member)(void *ctx, int group, int i), void *ctx, char *err,
                       size_t len);
void dt_sim_groups_free(dt_sim_groups *g);

/* One collective over every group: a recording per shape. */
typedef struct {
    const dt_sim_groups *g;
    dt_sim_sched *by_shape; /* [g->nshapes] */
} dt_sim_group_coll;

/* Records `kind` of `bytes` (per group, as dt_sim_sched_record counts
 * them) by `algo` (NULL: auto's choice on each shape's stand-in world).
 * 0, or -1 with a message. */
int dt_sim_group_coll_record(dt_sim_group_coll *c, const dt_sim_groups *g, const dt_sim_world *w,
                             dt_coll_kind kind, const char *algo, size_t bytes, char *err,
                             size_t len);
void dt_sim_group_coll_free(dt_sim_group_coll *c);

#endif
