/* A layout's memory per rank for `dtrain plan`: the run's own plan (the
 * code behind the start-up table and `--dry-run`) on a configuration made
 * from the layout. See plan.h. */
#include <string.h>

#include "core/str.h"
#include "plan/plan.h"
#include "train/config/config.h"
#include "plan/plan_internal.h"
#include "train/memory/plan_mesh.h"

#define GIB(x) ((double)(x) / (1024.0 * 1024.0 * 1024.0))

/* The training configuration a run of layout l would parse. Mixed
 * precision accumulates gradients in bf16, the ZeRO paper's 2 + 2 + 12
 * bytes a parameter. */
static void config_of(const dt_plan_input *in, const dt_plan_layout *l, dt_train_config *c)
{
    static const char *rc[] = {"none", "selective", "full"};
    dt_config_defaults(c);
    c->tp = l->tp, c->cp = l->cp, c->pp = l->pp;
    c->sequence_parallel = l->sp;
    c->zero_stage = l->zero;
    c->batch_size = l->B;
    c->grad_accum = l->M;
    c->seq_len = in->T;
    c->pp_virtual = l->V;
    dt_strf(c->pp_schedule, sizeof c->pp_schedule, "%s", dt_pp_kind_name(l->sched));
    dt_strf(c->recompute, sizeof c->recompute, "%s", rc[l->rc]);
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

/* The places that hold the most: the first stage (the embeddings, the
 * most micro-batches in flight) and the last (the head, its logits), at
 * the first and the last tensor slice (the vocabulary's remainder); their
 * holdings kept in the memo for the layouts that differ only in the ZeRO
 * stage. */
static int places_of(const dt_plan_input *in, dt_plan_places *P, const dt_plan_layout *l,
                     const dt_train_config *c, char *err, size_t n)
{
    dt_plan_layout key = *l;
    key.zero = 0;
    if (P->have && !memcmp(&key, &P->key, sizeof key)) return 0;
    if (P->have) dt_gpt_destroy(&P->layout);
    P->have = 0;
    if (dt_gpt_create_layout(&P->layout, &in->model, in->bf16 ? DT_PREC_BF16 : DT_PREC_F32, err,
                             n))
        return -1;
    P->have = 1;
    P->key = key;
    P->layout.acts.recompute = l->rc;
    dt_mem_plan_mesh_ctx x;
    if (dt_mem_plan_mesh_begin(&x, &P->layout, c, l->tp * l->cp * l->dp * l->pp, err, n))
        return P->have = 0, dt_gpt_destroy(&P->layout), -1;
    const int stages[2] = {0, l->pp - 1}, slices[2] = {0, l->tp - 1};
    int rc = 0, flight;
    P->n = 0;
    for (int i = 0; rc == 0 && i < (l->pp > 1 ? 2 : 1); i++)
        for (int j = 0; rc == 0 && j < (l->tp > 1 ? 2 : 1); j++, P->n++) {
            P->stage[P->n] = stages[i], P->tp_rank[P->n] = slices[j];
            rc = dt_mem_plan_mesh_held(&x, stages[i], slices[j], &P->held[P->n], &flight, err, n);
        }
    dt_mem_plan_mesh_end(&x);
    if (rc) P->have = 0, dt_gpt_destroy(&P->layout);
    return rc;
}

int dt_plan_memory(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l,
                   dt_plan_row *row, char *err, size_t errlen)
{
    dt_train_config cfg;
    dt_plan_places *P = &c->places;
    config_of(in, l, &cfg);
    if (places_of(in, P, l, &cfg, err, errlen)) return -1;
    double most = -1;
    int at = 0;
    for (int i = 0; i < P->n; i++) {
        dt_mem_plan plan;
        if (dt_mem_plan_held(&P->layout, &cfg, l->cp * l->dp, &P->held[i], &plan, err, errlen))
            return -1;
        if (total(&plan) <= most) continue;
        most = total(&plan), at = i;
        memcpy(row->mem, plan.bytes, sizeof row->mem);
        row->psi = plan.psi;
    }
    row->mem_total = most;
    row->fits = row->mem_total <= in->mem;
    if (!row->fits)
        dt_strf(row->why, sizeof row->why, "needs %.1f GiB per rank (stage %d, tp rank %d), "
                "has %.1f", GIB(row->mem_total), P->stage[at], P->tp_rank[at], GIB(in->mem));
    return 0;
}
