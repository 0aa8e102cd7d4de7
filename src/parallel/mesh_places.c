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

/* Every stage on each of the tp slice (or ep share) layouts: a stage's
 * slots come from the schedule alone, counted once for its slices. */
static int stage_places(const mesh_job *x, dt_places *pl, char *err, size_t n)
{
    const int ep = x->j->o->ep > 1 ? x->j->o->ep : 1, tp = x->j->o->tp * ep;
    dt_gpt *peer = calloc((size_t)tp, sizeof *peer);
    int made = 0, rc = 0;
    if (!peer) return dt_strf(err, n, "mesh places: out of memory"), -1;
    for (int t = 0; rc == 0 && t < tp; t++)
        if ((rc = ep > 1 ? dt_gpt_ep_peer_layout(&x->rows, t, ep, &peer[t], err, n)
                         : dt_gpt_peer_layout(&x->rows, t, tp, &peer[t], err, n)) == 0)
            made++;
    for (int q = 0; rc == 0 && q < x->sched.p; q++) {
        dt_gpt_part *parts;
        int slots = dt_pp_stage_slots(&x->sched, x->cut, q, &parts);
        if (slots < 1) {
            dt_strf(err, n, "pipeline stage %d: out of memory for its plan", q);
            rc = -1;
            break;
        }
        for (int t = 0; t < tp; t++) stage_place(x, &peer[t], q, slots, parts, &pl->at[q * tp + t]);
        free(parts);
    }
    for (int t = 0; t < made; t++) dt_gpt_destroy(&peer[t]);
    free(peer);
    return rc;
}

/* Each slice's place, without a pipeline; with expert parallelism each
 * ep rank's (its experts, the whole rest). */
static int slice_places(const mesh_job *x, dt_places *pl, char *err, size_t n)
{
    const dt_parallel_opts *o = x->j->o;
    for (int q = 0; o->ep > 1 && q < o->ep; q++)
        if (dt_ep_rank_mem(&x->rows, q, o->ep, x->j->B, x->j->T, &pl->at[q].mem, err, n))
            return -1;
    for (int t = 0; o->ep <= 1 && t < o->tp; t++)
        if (dt_tp_rank_mem(&x->rows, t, o->tp, x->j->B, x->j->T, &pl->at[t].mem, err, n))
            return -1;
    return 0;
}

/* The table's words: what a row is, and each row's place. */
static void describe(const mesh_job *x, dt_places *pl)
{
    const dt_parallel_opts *o = x->j->o;
    if (o->ep > 1) {
        const int copies = o->cp * x->dp / o->ep;
        for (int i = 0; o->pp > 1 && i < pl->n; i++) {
            dt_place *p = &pl->at[i];
            p->stage = i / o->ep;
            p->ranks = p->mem.copies = copies;
            dt_strf(p->label, sizeof p->label, "stage %d (%d in flight), ep rank %d", p->stage,
                    p->in_flight, i % o->ep);
        }
        if (o->pp > 1) {
            dt_strf(pl->rows, sizeof pl->rows, "pp %d x dp %d in ep groups of %d; a row is "
                    "every rank of that stage and ep index (its stage's layers: its experts and "
                    "the whole rest)", o->pp, x->dp, o->ep);
            return;
        }
        dt_strf(pl->rows, sizeof pl->rows, "dp %d in ep groups of %d; a row is every rank of "
                "that ep index (its experts and the whole rest; the cp x dp / ep = %d ranks "
                "beside it hold the same)", x->dp, o->ep, copies);
        for (int i = 0; i < pl->n; i++) {
            pl->at[i].ranks = pl->at[i].mem.copies = copies;
            dt_strf(pl->at[i].label, sizeof pl->at[i].label, "ep rank %d", i);
        }
        return;
    }
    dt_strf(pl->rows, sizeof pl->rows, "tp %d x cp %d x dp %d x pp %d; a row is every rank at "
            "that place (%s%s%s; the cp x dp = %d ranks beside it hold the same)", o->tp, o->cp,
            x->dp, o->pp, o->pp > 1 ? "its stage's layers, " : "",
            o->tp > 1 ? "its slices of the matrices and the whole vectors, " : "the whole model, ",
            o->cp > 1 ? "its rows of each sequence" : "whole sequences", o->cp * x->dp);
    for (int i = 0; i < pl->n; i++) {
        dt_place *p = &pl->at[i];
        p->stage = i / o->tp, p->tp_rank = i % o->tp;
        p->ranks = o->cp * x->dp;
        p->mem.copies = o->cp * x->dp;
        if (o->pp > 1)
            dt_strf(p->label, sizeof p->label, "stage %d (%d in flight), tp rank %d", p->stage,
                    p->in_flight, p->tp_rank);
        else dt_strf(p->label, sizeof p->label, "tp rank %d", p->tp_rank);
    }
    if (x->cut && o->tp == 1 && o->cp == 1)
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
