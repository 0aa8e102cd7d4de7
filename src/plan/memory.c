/* A layout's memory per rank for `dtrain plan`: the run's own plan (the
 * ddp kind's places, as `--dry-run` prints them, in bytes by the ZeRO
 * formulas) on a configuration made from the layout. See plan.h. */
#include <string.h>

#include "core/str.h"
#include "plan/plan.h"
#include "train/config/config.h"
#include "plan/plan_internal.h"
#include "parallel/registry.h"
#include "train/memory/plan_pp.h"

#define GIB(x) ((double)(x) / (1024.0 * 1024.0 * 1024.0))

/* The training configuration a run of layout l would parse. Mixed
 * precision accumulates gradients in bf16, the ZeRO paper's 2 + 2 + 12
 * bytes a parameter. */
static void config_of(const dt_plan_input *in, const dt_plan_layout *l, dt_train_config *c)
{
    dt_config_defaults(c);
    c->tp = l->tp, c->cp = l->cp, c->pp = l->pp, c->ep = l->ep;
    c->sequence_parallel = l->sp;
    c->zero_stage = l->zero;
    c->batch_size = l->B;
    c->grad_accum = l->M;
    c->seq_len = in->T;
    c->pp_virtual = l->V;
    dt_strf(c->pp_schedule, sizeof c->pp_schedule, "%s", dt_pp_kind_name(l->sched));
    dt_strf(c->recompute, sizeof c->recompute, "%s", dt_recompute_name(l->rc));
    if (in->bf16) {
        dt_strf(c->dtype, sizeof c->dtype, "bf16");
        dt_strf(c->grad_accum_dtype, sizeof c->grad_accum_dtype, "bf16");
    }
}

/* What the rank holds at its peak: the plan's state and activations, and
 * the transient windows beyond them (ZeRO's gathered layers and their
 * fp32 gradients in backward, mixed precision's widened segments), which
 * a run's peak counts too. */
static double total(const dt_mem_plan *p)
{
    return dt_mem_plan_state(p) + p->bytes[DT_MEM_ACTS] + p->window_params + p->window_grads +
           p->window_widened;
}

/* The layout's places by the ddp kind's own hook (what `dtrain train
 * --dry-run` prints), before the ZeRO stage divides their state: the memo
 * keeps them for the layouts that differ only in the stage. */
static int places_of(const dt_plan_input *in, dt_plan_places *P, const dt_plan_layout *l,
                     const dt_train_config *c, char *err, size_t n)
{
    dt_plan_layout key = *l;
    key.zero = 0;
    if (P->have && !memcmp(&key, &P->key, sizeof key)) return 0;
    dt_plan_places_free(P);
    if (dt_gpt_create_layout(&P->layout, &in->model, in->bf16 ? DT_PREC_BF16 : DT_PREC_F32, err,
                             n))
        return -1;
    P->layout.acts.recompute = l->rc;
    dt_parallel_opts o = dt_config_parallel_opts(c);
    o.zero.stage = 0;
    dt_places_job job = {&o, &P->layout, l->tp * l->cp * l->dp * l->pp, l->B,
                         c->seq_len ? c->seq_len : P->layout.cfg.block_size};
    if (dt_strategy_find("ddp")->places(&job, &P->places, err, n))
        return dt_gpt_destroy(&P->layout), -1;
    P->have = 1;
    P->key = key;
    return 0;
}

void dt_plan_places_free(dt_plan_places *P)
{
    if (!P->have) return;
    dt_places_free(&P->places);
    dt_gpt_destroy(&P->layout);
    P->have = 0;
}

int dt_plan_memory(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l,
                   dt_plan_row *row, char *err, size_t errlen)
{
    dt_train_config cfg;
    dt_plan_places *P = &c->places;
    config_of(in, l, &cfg);
    if (places_of(in, P, l, &cfg, err, errlen)) return -1;
    double most = -1;
    int most_at = 0;
    for (int i = 0; i < P->places.n; i++) {
        const dt_place *at = &P->places.at[i];
        dt_mem_plan plan;
        if (dt_mem_plan_held(&P->layout, &cfg, at->mem.copies, &at->mem, &plan, err, errlen))
            return -1;
        if (total(&plan) <= most) continue;
        most = total(&plan), most_at = i;
        memcpy(row->mem, plan.bytes, sizeof row->mem);
        row->psi = plan.psi;
    }
    row->mem_total = most;
    row->fits = row->mem_total <= in->mem;
    if (!row->fits)
        dt_strf(row->why, sizeof row->why, "needs %.1f GiB per rank (stage %d, tp rank %d), "
                "has %.1f", GIB(row->mem_total), P->places.at[most_at].stage,
                P->places.at[most_at].tp_rank, GIB(in->mem));
    return 0;
}
