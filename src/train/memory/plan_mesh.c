/* Each (stage, tp rank)'s memory plan on a mesh. See memory/plan_mesh.h. */
#include "train/memory/plan_mesh.h"

#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "kernels/attention_ring.h"
#include "parallel/context/cp.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/tensor/tp.h"

#define MIB(x) ((double)(x) / 1048576.0)

/* The run's rows on the layout: context parallelism's cut (checked the way
 * a run checks it) and sequence parallelism's flag, which every rank's
 * slice layout keeps. */
static int set_rows(dt_gpt *layout, const dt_train_config *c, int T, char *err, size_t n)
{
    dt_shard_kind kind;
    int widths;
    dt_cp_algo_shape(c->cp_algo, &kind, &widths);
    char who[48];
    dt_strf(who, sizeof who, "--cp %d --cp-algo %s", c->cp, c->cp_algo);
    if (c->cp > 1 && dt_seq_shard_check(who, c->batch_size, T, layout->cfg.n_embd,
                                        layout->cfg.n_head, c->cp, kind, err, n))
        return -1;
    if (dt_gpt_set_cp(layout, 0, c->cp, kind, widths))
        return dt_strf(err, n, "%s", layout->error), -1;
    layout->tp.sp = c->sequence_parallel;
    return 0;
}

/* The schedule and cut of a pipeline, as its layer computes them (on the
 * whole model's layout). */
static int pipeline_cut(const dt_gpt *layout, const dt_train_config *c, int world,
                        dt_pp_schedule *s, int **cut, char *err, size_t n)
{
    dt_parallel_opts o = dt_config_parallel_opts(c);
    dt_pp_part_kind part;
    int per_stage;
    if (dt_pp_part_parse(c->pp_partition, &part) || part == DT_PP_PART_COST)
        return dt_strf(err, n, "--pp-partition %s: plan with uniform or params (cost times "
                       "layers when the run starts)", c->pp_partition), -1;
    if (dt_pp_check_schedule(&o, world, c->grad_accum, &per_stage, s, err, n)) return -1;
    const int S = s->p * s->V;
    if (!(*cut = malloc((size_t)(S + 1) * sizeof **cut)))
        return dt_strf(err, n, "mesh plan: out of memory"), -1;
    return dt_pp_cut(layout, S, part, s->kind == DT_PP_INTERLEAVED, NULL, *cut, err, n);
}

int dt_mem_plan_mesh_begin(dt_mem_plan_mesh_ctx *x, dt_gpt *layout, const dt_train_config *c,
                           int world, char *err, size_t errlen)
{
    memset(x, 0, sizeof *x);
    const int k = c->tp * c->cp * c->pp;
    x->layout = layout;
    x->c = c;
    x->T = c->seq_len ? c->seq_len : layout->cfg.block_size;
    if (world % k)
        return dt_strf(err, errlen, "tp %d x cp %d x pp %d does not divide %d ranks", c->tp,
                       c->cp, c->pp, world), -1;
    x->cp = c->cp, x->dp = world / k, x->pp = c->pp;
    if (set_rows(layout, c, x->T, err, errlen)) return -1;
    if (c->pp > 1 && pipeline_cut(layout, c, world, &x->sched, &x->cut, err, errlen))
        return dt_mem_plan_mesh_end(x), -1;
    return 0;
}

/* What (stage q, tp rank t) holds: its slice layout, of which a pipeline
 * stage's part. */
int dt_mem_plan_mesh_held(dt_mem_plan_mesh_ctx *x, int q, int t, dt_rank_mem *held,
                          int *in_flight, char *err, size_t n)
{
    const dt_train_config *c = x->c;
    *in_flight = 0;
    if (!x->cut) return dt_tp_rank_mem(x->layout, t, c->tp, c->batch_size, x->T, held, err, n);
    dt_gpt peer;
    dt_pp_stage_mem sm;
    if (dt_gpt_peer_layout(x->layout, t, c->tp, &peer, err, n)) return -1;
    int rc = dt_pp_stage_memory(&peer, &x->sched, x->cut, q, c->batch_size, x->T, &sm);
    dt_gpt_destroy(&peer);
    if (rc) return dt_strf(err, n, "pipeline stage %d: out of memory for its plan", q), -1;
    *held = (dt_rank_mem){.floats = sm.floats, .in_use = sm.in_use, .grads_open = sm.grads_open,
                          .acts = sm.acts};
    *in_flight = sm.slots;
    return 0;
}

int dt_mem_plan_mesh_place(dt_mem_plan_mesh_ctx *x, int q, int t, dt_mesh_rank_plan *out,
                           char *err, size_t n)
{
    dt_rank_mem held;
    *out = (dt_mesh_rank_plan){.stage = q, .tp_rank = t};
    if (dt_mem_plan_mesh_held(x, q, t, &held, &out->in_flight, err, n)) return -1;
    return dt_mem_plan_held(x->layout, x->c, x->cp * x->dp, &held, &out->plan, err, n);
}

void dt_mem_plan_mesh_end(dt_mem_plan_mesh_ctx *x)
{
    if (x->cut) dt_pp_schedule_free(&x->sched);
    free(x->cut);
    x->cut = NULL;
}

int dt_mem_plan_mesh_from_config(dt_gpt *layout, const dt_train_config *c, int world,
                                 dt_mem_plan_mesh *m, char *err, size_t errlen)
{
    dt_mem_plan_mesh_ctx x;
    memset(m, 0, sizeof *m);
    if (dt_mem_plan_mesh_begin(&x, layout, c, world, err, errlen)) return -1;
    *m = (dt_mem_plan_mesh){.tp = c->tp, .cp = c->cp, .dp = x.dp, .pp = c->pp,
                            .n = c->pp * c->tp};
    int rc = (m->ranks = calloc((size_t)m->n, sizeof *m->ranks)) ? 0
             : dt_strf(err, errlen, "mesh plan: out of memory");
    for (int i = 0; rc == 0 && i < m->n; i++)
        rc = dt_mem_plan_mesh_place(&x, i / m->tp, i % m->tp, &m->ranks[i], err, errlen);
    dt_mem_plan_mesh_end(&x);
    if (rc) dt_mem_plan_mesh_free(m);
    return rc ? -1 : 0;
}

void dt_mem_plan_mesh_free(dt_mem_plan_mesh *m)
{
    free(m->ranks);
    m->ranks = NULL;
    m->n = 0;
}

static double total(const dt_mem_plan *p) { return dt_mem_plan_state(p) + p->bytes[DT_MEM_ACTS]; }

double dt_mem_plan_mesh_peak(const dt_mem_plan_mesh *m)
{
    double most = 0;
    for (int i = 0; i < m->n; i++)
        if (total(&m->ranks[i].plan) > most) most = total(&m->ranks[i].plan);
    return most;
}

void dt_mem_plan_mesh_print(FILE *f, const dt_mem_plan_mesh *m)
{
    const dt_mem_plan *p0 = &m->ranks[0].plan;
    fprintf(f, "memory per rank: tp %d x cp %d x dp %d x pp %d; a row is every rank at that "
            "place (%s%s%s; the cp x dp = %d ranks beside it hold the same); params %s | "
            "grads %s | optim %s\n", m->tp, m->cp, m->dp, m->pp,
            m->pp > 1 ? "its stage's layers, " : "",
            m->tp > 1 ? "its slices of the matrices and the whole vectors, " : "the whole model, ",
            m->cp > 1 ? "its rows of each sequence" : "whole sequences", m->cp * m->dp,
            p0->formula[DT_MEM_PARAMS], p0->formula[DT_MEM_GRADS], p0->formula[DT_MEM_OPTIM]);
    for (int i = 0; i < m->n; i++) {
        const dt_mesh_rank_plan *r = &m->ranks[i];
        const dt_mem_plan *p = &r->plan;
        if (m->pp > 1) fprintf(f, "  stage %d (%d in flight), ", r->stage, r->in_flight);
        else fprintf(f, "  ");
        fprintf(f, "tp rank %d: Psi_q = %zu | params %.1f MiB | grads %.1f MiB | optim %.1f "
                "MiB | acts %.1f MiB | state + acts %.1f MiB\n", r->tp_rank, p->psi,
                MIB(p->bytes[DT_MEM_PARAMS]), MIB(p->bytes[DT_MEM_GRADS]),
                MIB(p->bytes[DT_MEM_OPTIM]), MIB(p->bytes[DT_MEM_ACTS]), MIB(total(p)));
    }
}
