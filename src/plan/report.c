/* What `dtrain plan` prints: the case, the best layouts with their
 * breakdown, the dropped by reason, the rule; or the same as JSON. See
 * plan.h. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/str.h"
#include "plan/plan.h"

#define GIB(x) ((double)(x) / (1024.0 * 1024.0 * 1024.0))
#define MS(x) ((x) * 1e3)

/* The model's sizes as its family has them: GPT-2's plain; the Llama
 * family's with its key/value heads, SwiGLU's width and its head. */
static void sizes(const dt_gpt_config *m, char *buf, size_t n)
{
    if (m->arch != DT_ARCH_LLAMA) {
        dt_strf(buf, n, "%d layers, %d heads, %d embd, vocab %d", m->n_layer, m->n_head,
                m->n_embd, m->vocab_size);
        return;
    }
    char kv[64] = "";
    if (dt_gpt_kv_heads(m) != m->n_head)
        dt_strf(kv, sizeof kv, " (%d key/value: grouped-query attention)", dt_gpt_kv_heads(m));
    dt_strf(buf, n, "%s, %d layers, %d heads%s, %d embd, SwiGLU width %d, vocab %d, %s head",
            dt_arch_of(m)->name, m->n_layer, m->n_head, kv, m->n_embd, dt_gpt_ffn(m),
            m->vocab_size, dt_gpt_tied(m) ? "tied" : "untied");
}

static void print_case(FILE *f, const dt_plan_input *in, const dt_plan_result *r)
{
    const dt_gpt_config *m = &in->model;
    const dt_link_cost *a = &in->links.link[DT_LINK_SHM], *b = &in->links.link[DT_LINK_TCP];
    const double psi = (double)dt_gpt_param_count(m);
    char model[200];
    sizes(m, model, sizeof model);
    fprintf(f, "model    %s%s%s: %.3g %s parameters, %s\n", in->model_name,
            in->model_name[0] ? ": " : "", model, psi >= 1e9 ? psi / 1e9 : psi / 1e6,
            psi >= 1e9 ? "B" : "M", in->bf16 ? "bf16 mixed precision (2 + 2 + 12 bytes a "
            "parameter)" : "fp32 (16 bytes a parameter with AdamW)");
    if (m->moe.experts)
        fprintf(f, "experts  %d a layer of width %d, top %d; expert parallelism's all-to-alls "
                "priced with the busiest rank taking %.2f x the mean rows (an assumption: "
                "--moe-skew)\n", m->moe.experts, m->moe.ffn ? m->moe.ffn : 4 * m->n_embd,
                m->moe.topk, in->moe_skew);
    fprintf(f, "batch    %ld sequences of %d tokens a step\n", in->batch, in->T);
    fprintf(f, "cluster  %d node%s x %d ranks = %d ranks, %.1f GiB each; links %s: within a host "
            "%.3g us + %.3g GB/s, between hosts %.3g us + %.3g GB/s; compute %.4g TFLOP/s a "
            "rank (%s); optimizer %.0f GB/s\n", in->nodes, in->nodes > 1 ? "s" : "", in->per_node,
            in->nodes * in->per_node,
            GIB(in->mem), in->links.source, a->alpha * 1e6, 1e-9 / a->beta, b->alpha * 1e6,
            1e-9 / b->beta, in->flops / 1e12, in->flops_source, in->opt_Bps / 1e9);
    fprintf(f, "weighed  %ld layouts in %.2f s: %d fit, %d dropped\n", r->considered, r->seconds,
            r->nfit, r->n - r->nfit);
}

static void print_row(FILE *f, int i, const dt_plan_row *w)
{
    char name[160];
    dt_plan_layout_name(&w->l, name, sizeof name);
    fprintf(f, "  %2d  %-84s %9.1f %11.4g %7.1f\n", i + 1, name, MS(w->step), w->tokens_per_s,
            GIB(w->mem_total));
}

static void print_breakdown(FILE *f, const dt_plan_row *w)
{
    char cores[48] = "", ep[96] = "";
    if (w->cores_s > 0) dt_strf(cores, sizeof cores, " + waiting for a core %.1f", MS(w->cores_s));
    if (w->l.ep > 1)
        dt_strf(ep, sizeof ep, " + expert all-to-alls %.1f (%.3g MB off the busiest rank)",
                MS(w->ep_s), w->ep_bytes / 1e6);
    fprintf(f, "      step %.1f ms = compute %.1f + bubble %.1f%s + tp %.1f + cp %.1f%s + "
            "pipeline messages %.1f + data parallel %.1f + optimizer %.1f ms\n", MS(w->step),
            MS(w->compute), MS(w->bubble), cores, MS(w->tp_s), MS(w->cp_s), ep, MS(w->pp_s),
            MS(w->dp_s), MS(w->opt_s));
    fprintf(f, "      memory of the rank that holds the most: params %.2f | grads %.2f | optim "
            "%.2f | acts %.2f GiB\n", GIB(w->mem[DT_MEM_PARAMS]), GIB(w->mem[DT_MEM_GRADS]),
            GIB(w->mem[DT_MEM_OPTIM]), GIB(w->mem[DT_MEM_ACTS]));
}

/* The dropped, counted by what they lack, with the nearest miss. */
static void print_dropped(FILE *f, const dt_plan_input *in, const dt_plan_result *r)
{
    if (r->nfit == r->n) return;
    const dt_plan_row *near = &r->rows[r->nfit];
    for (int i = r->nfit; i < r->n; i++)
        if (r->rows[i].mem_total < near->mem_total) near = &r->rows[i];
    char name[160];
    dt_plan_layout_name(&near->l, name, sizeof name);
    fprintf(f, "dropped  %d layouts need more than the %.1f GiB a rank has; the nearest: %s: %s\n",
            r->n - r->nfit, GIB(in->mem), name, near->why);
}

void dt_plan_print(FILE *f, const dt_plan_input *in, const dt_plan_result *r, int top)
{
    print_case(f, in, r);
    if (r->nfit == 0) {
        print_dropped(f, in, r);
        fprintf(f, "no layout fits: more ranks, more memory a rank, a smaller micro-batch or "
                "sequence, or mixed precision would\n");
        dt_plan_rule(f, in, r);
        return;
    }
    fprintf(f, "\nbest layouts (step time by the cost model; memory of the rank that holds the "
            "most):\n  %2s  %-84s %9s %11s %7s\n", "#", "layout", "step ms", "tokens/s", "GiB");
    for (int i = 0; i < top && i < r->nfit; i++) {
        print_row(f, i, &r->rows[i]);
        if (i < 3) print_breakdown(f, &r->rows[i]);
    }
    fprintf(f, "\n");
    print_dropped(f, in, r);
    dt_plan_rule(f, in, r);
}

static cJSON *row_json(const dt_plan_row *w)
{
    cJSON *o = cJSON_CreateObject();
    char name[160];
    dt_plan_layout_name(&w->l, name, sizeof name);
    cJSON_AddStringToObject(o, "layout", name);
    const char *keys[] = {"tp", "cp", "dp", "pp", "virtual", "micro_batch", "micro_batches",
                          "zero_stage", "sequence_parallel", "ep"};
    const int vals[] = {w->l.tp, w->l.cp, w->l.dp, w->l.pp, w->l.V, w->l.B, w->l.M, w->l.zero,
                        w->l.sp, w->l.ep};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        cJSON_AddNumberToObject(o, keys[i], vals[i]);
    cJSON_AddStringToObject(o, "schedule", w->l.pp > 1 ? dt_pp_kind_name(w->l.sched) : "none");
    cJSON_AddStringToObject(o, "recompute", dt_recompute_name(w->l.rc));
    const char *t[] = {"step_s", "compute_s", "bubble_s", "cores_s", "tp_s", "cp_s", "ep_s",
                       "pp_s", "dp_s", "optimizer_s", "tokens_per_s", "memory_bytes",
                       "ep_bytes_per_step"};
    const double tv[] = {w->step, w->compute, w->bubble, w->cores_s, w->tp_s, w->cp_s,
                         w->ep_s, w->pp_s, w->dp_s, w->opt_s, w->tokens_per_s, w->mem_total,
                         w->ep_bytes};
    cJSON_AddNumberToObject(o, "params_per_rank", (double)w->psi);
    for (size_t i = 0; i < sizeof tv / sizeof tv[0]; i++) cJSON_AddNumberToObject(o, t[i], tv[i]);
    const char *mk[] = {"params", "grads", "optim", "acts"};
    cJSON *mem = cJSON_AddObjectToObject(o, "memory_by_kind");
    for (int i = 0; i < 4; i++) cJSON_AddNumberToObject(mem, mk[i], w->mem[i]);
    if (!w->fits) cJSON_AddStringToObject(o, "dropped", w->why);
    return o;
}

int dt_plan_print_json(FILE *f, const dt_plan_input *in, const dt_plan_result *r, int top)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "ranks", in->nodes * in->per_node);
    cJSON_AddNumberToObject(o, "layouts_weighed", (double)r->considered);
    cJSON_AddNumberToObject(o, "layouts_fitting", r->nfit);
    cJSON_AddNumberToObject(o, "seconds", r->seconds);
    cJSON *best = cJSON_AddArrayToObject(o, "best");
    for (int i = 0; i < top && i < r->nfit; i++) cJSON_AddItemToArray(best, row_json(&r->rows[i]));
    cJSON *drop = cJSON_AddArrayToObject(o, "dropped_examples");
    for (int i = r->nfit; i < r->n && i < r->nfit + top; i++)
        cJSON_AddItemToArray(drop, row_json(&r->rows[i]));
    char *s = cJSON_Print(o);
    int rc = s && fprintf(f, "%s\n", s) > 0 ? 0 : -1;
    free(s);
    cJSON_Delete(o);
    return rc;
}
