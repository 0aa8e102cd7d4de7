/* A layout's memory per rank for `dtrain plan`: the run's own plan (the
 * ddp kind's places, as `--dry-run` prints them, in bytes by the ZeRO
 * formulas) on a configuration made from the layout. See plan.h. */
#include <string.h>

#include "core/str.h"
#include "plan/plan.h"
#include "train/config/config.h"
#include "plan/plan_internal.h"
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

/* Whether place i holds what place j < i does: the same plan, so not more
 * (the tensor slices of a stage and the stages of a pipeline's middle
 * mostly do). */
static int same_place(const dt_plan_place *a, const dt_plan_place *b)
{
    return a->mem.floats == b->mem.floats && a->mem.in_use == b->mem.in_use &&
           a->mem.grads_open == b->mem.grads_open && a->mem.acts == b->mem.acts &&
           a->mem.copies == b->mem.copies;
}

static int seen(const dt_plan_places *P, int i, int per_stage)
{
    return (i >= 1 && same_place(&P->at[i], &P->at[i - 1])) ||
           (i >= per_stage && same_place(&P->at[i], &P->at[i - per_stage]));
}

int dt_plan_memory(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l,
                   dt_plan_row *row, char *err, size_t errlen)
{
    dt_train_config cfg;
    const dt_plan_places *P = &c->places;
    config_of(in, l, &cfg);
    if (dt_plan_places_of(in, c, l, err, errlen)) return -1;
    double most = -1;
    int most_at = 0;
    const int per_stage = P->n / l->pp;
    for (int i = 0; i < P->n; i++) {
        const dt_plan_place *at = &P->at[i];
        dt_mem_plan plan;
        if (seen(P, i, per_stage)) continue;
        if (dt_mem_plan_held(&c->whole, &cfg, at->mem.copies, &at->mem, &plan, err, errlen))
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
                "has %.1f", GIB(row->mem_total), P->at[most_at].stage,
                P->at[most_at].tp_rank, GIB(in->mem));
    return 0;
}
