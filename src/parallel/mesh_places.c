/* What each (pipeline stage, tensor slice) of a mesh holds, by arithmetic
 * over the layout: a rank's slice layout (dt_gpt_peer_layout, as a run's
 * tp layer lays its model), of which a pipeline stage's part
 * (dt_pp_stage_memory, what the pipeline layer holds). See mesh.h. */
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "kernels/attention_ring.h"
#include "parallel/context/cp.h"
#include "parallel/expert/ep.h"
#include "parallel/mesh.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/pipeline/stage.h"
#include "parallel/tensor/tp.h"

/* What every place shares: the sizes, the rows, the pipeline. */
typedef struct {
    const dt_places_job *j;
    dt_gpt rows;  /* the job's layout with the run's context and sequence parallelism
                     set: a copy of the struct, its tables the job's */
    int dp;
    dt_pp_schedule sched;
    dt_pp_part_kind part;
    int *cut;     /* NULL without a pipeline */
} mesh_job;

/* The run's rows: context parallelism's cut and sequence parallelism's
 * flag, which every slice layout keeps; the micro-batch checked on a
 * slice as a run's allocation checks it (the block, cp's cut of the
 * sequence over the slice's heads, sp's split of the rows). */
static int set_rows(mesh_job *x, char *err, size_t n)
{
    const dt_parallel_opts *o = x->j->o;
    dt_gpt *m = &x->rows, slice;
    dt_shard_kind kind;
    int widths;
    dt_cp_algo_shape(o->cp_algo, &kind, &widths);
    if (dt_gpt_set_cp(m, 0, o->cp, kind, widths)) return dt_strf(err, n, "%s", m->error), -1;
    m->tp.sp = o->sp;
    if (dt_gpt_peer_layout(m, 0, o->tp, &slice, err, n)) return -1;
    int rc = dt_gpt_check_micro_batch(&slice, x->j->B, x->j->T);
    if (rc) dt_strf(err, n, "%s", slice.error);
    dt_gpt_destroy(&slice);
    return rc;
}

/* The schedule and cut of the pipeline, as its layer computes them. */
static int pipeline_cut(mesh_job *x, char *err, size_t n)
{
    const dt_parallel_opts *o = x->j->o;
    int per_stage;
    if (dt_pp_part_parse(o->pp_partition, &x->part) || x->part == DT_PP_PART_COST)
        return dt_strf(err, n, "--pp-partition %s: plan with uniform or params (cost times "
                       "layers when the run starts)", o->pp_partition), -1;
    if (dt_pp_check_schedule(o, x->j->world, o->accum, &per_stage, &x->sched, err, n)) return -1;
    const int S = x->sched.p * x->sched.V;
    if (!(x->cut = malloc((size_t)(S + 1) * sizeof *x->cut))) {
        dt_pp_schedule_free(&x->sched);
        return dt_strf(err, n, "mesh places: out of memory"), -1;
    }
    return dt_pp_cut(&x->rows, S, x->part, x->sched.kind == DT_PP_INTERLEAVED, NULL, x->cut, err,
                     n);
}

static void end(mesh_job *x)
{
    if (x->cut) dt_pp_schedule_free(&x->sched);
    free(x->cut);
    x->cut = NULL;
}

static int begin(mesh_job *x, const dt_places_job *j, char *err, size_t n)
{
    const dt_parallel_opts *o = j->o;
    memset(x, 0, sizeof *x);
    x->j = j;
    x->rows = *j->layout;
    if (dt_mesh_check(o, j->world, &x->dp, err, n)) return -1;
    if (set_rows(x, err, n)) return -1;
    if (o->pp > 1 && pipeline_cut(x, err, n)) return end(x), -1;
    return 0;
}

/* "0-2", or with chunks "0,2" or "0-1,8-9": pipeline rank q's layers. */
static void layers(const mesh_job *x, int q, char *buf, size_t n)
{
    buf[0] = 0;
    for (int c = 0; c < x->sched.V; c++) {
        int k = c * x->sched.p + q, lo = x->cut[k], hi = x->cut[k + 1] - 1;
        size_t at = strlen(buf);
        if (lo == hi) dt_strf(buf + at, n - at, "%s%d", c ? "," : "", lo);
        else dt_strf(buf + at, n - at, "%s%d-%d", c ? "," : "", lo, hi);
    }
}

/* Stage q's place on tensor slice `peer`'s layout, given its slots. */
static void stage_place(const mesh_job *x, const dt_gpt *peer, int q, int slots,
                        const dt_gpt_part *parts, dt_place *p)
{
    dt_pp_stage_mem sm;
    dt_pp_stage_memory_of(peer, &x->sched, x->cut, q, x->j->B, x->j->T, slots, parts, &sm);
    p->mem = (dt_rank_mem){.floats = sm.floats, .in_use = sm.in_use,
                           .grads_open = sm.grads_open, .acts = sm.acts};
    p->in_flight = sm.slots;
    layers(x, q, p->layers, sizeof p->layers);
}

/* The shares of the model a stage's ranks hold: tp slices x ep sets of
 * experts, share k = tp slice k / ep, experts of ep rank k % ep. */
static int shares(const mesh_job *x) { return x->j->o->tp * (x->j->o->ep > 1 ? x->j->o->ep : 1); }

static int share_layout(const mesh_job *x, int k, dt_gpt *lay, char *err, size_t n)
{
    const int ep = x->j->o->ep > 1 ? x->j->o->ep : 1;
    if (dt_gpt_peer_layout(&x->rows, k / ep, x->j->o->tp, lay, err, n)) return -1;
    if (dt_gpt_set_ep(lay, k % ep, ep) == 0) return 0;
    dt_strf(err, n, "%s", lay->error);
    dt_gpt_destroy(lay);
    return -1;
}

/* Every stage on each share's layout: a stage's slots come from the
 * schedule alone, counted once for its shares. */
static int stage_places(const mesh_job *x, dt_places *pl, char *err, size_t n)
{
    const int ns = shares(x);
    dt_gpt *peer = calloc((size_t)ns, sizeof *peer);
    int made = 0, rc = 0;
    if (!peer) return dt_strf(err, n, "mesh places: out of memory"), -1;
    for (int k = 0; rc == 0 && k < ns; k++)
        if ((rc = share_layout(x, k, &peer[k], err, n)) == 0) made++;
    for (int q = 0; rc == 0 && q < x->sched.p; q++) {
        dt_gpt_part *parts;
        int slots = dt_pp_stage_slots(&x->sched, x->cut, q, &parts);
        if (slots < 1) {
            dt_strf(err, n, "pipeline stage %d: out of memory for its plan", q);
            rc = -1;
            break;
        }
        for (int k = 0; k < ns; k++) stage_place(x, &peer[k], q, slots, parts, &pl->at[q * ns + k]);
        free(parts);
    }
    for (int k = 0; k < made; k++) dt_gpt_destroy(&peer[k]);
    free(peer);
    return rc;
}

/* Each share's place, without a pipeline. */
static int slice_places(const mesh_job *x, dt_places *pl, char *err, size_t n)
{
    for (int k = 0; k < shares(x); k++) {
        dt_gpt lay;
        if (share_layout(x, k, &lay, err, n)) return -1;
        dt_places_layout_mem(&lay, x->j->B, x->j->T, &pl->at[k].mem);
        dt_gpt_destroy(&lay);
    }
    return 0;
}

/* "tp rank 1, ep rank 0", with the stage in front under a pipeline. */
static void label(const mesh_job *x, dt_place *p, int ep_rank)
{
    const dt_parallel_opts *o = x->j->o;
    char share[48];
    if (o->ep > 1 && o->tp > 1) dt_strf(share, sizeof share, "tp rank %d, ep rank %d", p->tp_rank,
                                        ep_rank);
    else if (o->ep > 1) dt_strf(share, sizeof share, "ep rank %d", ep_rank);
    else dt_strf(share, sizeof share, "tp rank %d", p->tp_rank);
    if (o->pp > 1)
        dt_strf(p->label, sizeof p->label, "stage %d (%d in flight), %s", p->stage, p->in_flight,
                share);
    else dt_strf(p->label, sizeof p->label, "%s", share);
}

/* The table's words: what a row is, and each row's place. */
static void describe(const mesh_job *x, dt_places *pl)
{
    const dt_parallel_opts *o = x->j->o;
    const int ep = o->ep > 1 ? o->ep : 1, ns = shares(x), copies = o->cp * x->dp / ep;
    dt_strf(pl->rows, sizeof pl->rows, "tp %d x cp %d x dp %d x pp %d%s; a row is every rank at "
            "that place (%s%s%s%s; the %d ranks beside it hold the same)", o->tp, o->cp, x->dp,
            o->pp, ep > 1 ? ", the dp ranks in ep groups" : "", o->pp > 1 ? "its stage's layers, "
            : "", o->tp > 1 ? "its slices of the matrices and the whole vectors, "
            : ep > 1 ? "" : "the whole model, ", ep > 1 ? "its share of the experts, " : "",
            o->cp > 1 ? "its rows of each sequence" : "whole sequences", copies);
    for (int i = 0; i < pl->n; i++) {
        dt_place *p = &pl->at[i];
        p->stage = i / ns, p->tp_rank = i % ns / ep;
        p->ranks = p->mem.copies = copies;
        label(x, p, i % ep);
    }
    if (x->cut && o->tp == 1 && o->cp == 1 && ep == 1)
        pl->pipe = (dt_places_pipe){.p = x->sched.p, .V = x->sched.V, .M = x->sched.M,
                                    .dp = x->dp, .kind = x->sched.kind, .part = x->part};
}

int dt_mesh_places(const dt_places_job *j, dt_places *pl, char *err, size_t n)
{
    mesh_job x;
    memset(pl, 0, sizeof *pl);
    if (begin(&x, j, err, n)) return -1;
    int rc = dt_places_alloc(pl, j->o->pp * j->o->tp * (j->o->ep > 1 ? j->o->ep : 1), err, n);
    if (rc == 0) rc = x.cut ? stage_places(&x, pl, err, n) : slice_places(&x, pl, err, n);
    if (rc == 0) describe(&x, pl);
    else dt_places_free(pl);
    end(&x);
    return rc;
}
