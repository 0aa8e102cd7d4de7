/* What layout.c (the step's setup, its run and summary) and layout_prog.c
 * (a pipeline rank's programs) share. */
#ifndef DT_SIM_LAYOUT_INTERNAL_H
#define DT_SIM_LAYOUT_INTERNAL_H

#include "parallel/pipeline/schedule.h"
#include "sim/group.h"
#include "sim/layout.h"

enum { LAY_TP, LAY_REPLICAS, LAY_EP, LAY_GROUPS }; /* the groups a collective runs over */

/* A collective the programs use; its index is its engine id. */
typedef struct {
    int over;          /* LAY_TP, LAY_REPLICAS or LAY_EP */
    dt_coll_kind kind;
    size_t bytes;
    dt_sim_group_coll c;
} lay_coll;

typedef struct {
    const dt_sim_layout_opts *o;
    dt_sim_world *w;
    int S, L;                 /* stages, layers */
    int *cut;                 /* [S + 1] stage k runs layers cut[k] .. cut[k+1]-1 */
    int tied;                 /* the head is the embeddings (the last stage holds a copy) */
    size_t *seg_bytes;        /* [L + 2] fp32 bytes of each segment, whole model */
    double layer_f, head_f;   /* seconds of a layer's and the head's forward, a micro-batch */
    double act_bytes;         /* tp's reduce of a micro-batch's activations */
    double msg_bytes;         /* a stage boundary's message */
    dt_pp_schedule sch;       /* pp > 1 */
    dt_pp_action *solo;       /* pp == 1: F, B of each micro-batch */
    dt_sim_groups groups[LAY_GROUPS]; /* tp groups, replicas, ep groups (n == 1: none) */
    int moe;                  /* moe branches a layer (0: dense, or no ep) */
    size_t ep_rows, ep_counts; /* bytes of a branch's row and count all-to-alls, a rank's */
    lay_coll *coll;
    int ncoll, capcoll;
    dt_sim_prog *compute, *comm; /* [pp] */
    int *events;                 /* [pp] events each pipeline rank's programs use */
    double *busy;                /* [pp] seconds each computes */
    double *opt_s;               /* [pp] of it, the optimizer */
    size_t *held;                /* [pp] parameters each holds (its tp slice) */
    int *dp_n;                   /* [pp] data-parallel collectives each issues a step */
    double *dp_pred;             /* [pp] their seconds by the cost model, summed */
    int *ep_n;                   /* [pp] ep all-to-alls each runs a step */
    double *ep_bytes;            /* [pp] their rows' bytes to other ranks */
} lay;

/* The collective `kind` of `bytes` over group `over` (recorded on first
 * use): its engine id, or -1 with a message. */
int lay_coll_id(lay *L, int over, dt_coll_kind kind, size_t bytes, char *err, size_t len);

/* Pipeline rank r's two programs into L->compute[r], L->comm[r]. 0, or -1
 * with a message. */
int lay_programs(lay *L, int r, char *err, size_t len);

#endif
