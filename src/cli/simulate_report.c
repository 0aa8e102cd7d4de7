/* What `dtrain simulate` prints (simulate.h). */
#include "cli/simulate.h"

static void put_setup(FILE *f, const dt_sim_world *w, int nics)
{
    const dt_cost_model *m = &w->model;
    fprintf(f, "ranks          %d (%d hosts of %d, %d NIC%s each)\n", w->ranks, w->hosts,
            w->per_host, nics, nics == 1 ? "" : "s");
    fprintf(f, "links          %s: within a host %.2f us, %.1f GB/s; across %.2f us, "
            "%.1f GB/s\n", m->source, m->link[DT_LINK_SHM].alpha * 1e6,
            1e-9 / m->link[DT_LINK_SHM].beta, m->link[DT_LINK_TCP].alpha * 1e6,
            1e-9 / m->link[DT_LINK_TCP].beta);
}

void sim_report_collective(FILE *f, const dt_sim_world *w, int nics, const char *kind,
                           const dt_sim_bench *b)
{
    put_setup(f, w, nics);
    fprintf(f, "collective     %s of %zu bytes\n", kind, b->bytes);
    fprintf(f, "algorithm      %s\n", b->algo);
    fprintf(f, "simulated      %.3f us\n", b->seconds * 1e6);
    fprintf(f, "predicted      %.3f us (cost model, no contention: %.2fx the simulated)\n",
            b->predicted * 1e6, b->seconds > 0 ? b->predicted / b->seconds : 0);
    fprintf(f, "simulator      %zu steps recorded in %.1f MiB (%.2f s), %lld messages played "
            "(%.2f s)\n", b->steps, (double)b->sched_bytes / 1048576.0, b->record_s,
            b->messages, b->run_s);
}

static void put_split(FILE *f, const char *who, const dt_sim_rank_stats *s, double step)
{
    fprintf(f, "  %-12s compute %9.3f ms (%4.1f%%)  exposed comm %9.3f ms (%4.1f%%)  "
            "idle %9.3f ms (%4.1f%%)\n", who, s->compute * 1e3, 100 * s->compute / step,
            s->exposed * 1e3, 100 * s->exposed / step, s->idle * 1e3, 100 * s->idle / step);
}

/* "GPT L12 H12 C768 V50257"; the Llama family's with its key/value
 * heads, SwiGLU's width and its head. */
static void model_sizes(const dt_gpt_config *c, char *buf, size_t n)
{
    if (c->arch != DT_ARCH_LLAMA) {
        snprintf(buf, n, "GPT L%d H%d C%d V%d", c->n_layer, c->n_head, c->n_embd, c->vocab_size);
        return;
    }
    snprintf(buf, n, "Llama L%d H%d KV%d C%d F%d V%d, %s head", c->n_layer, c->n_head,
             dt_gpt_kv_heads(c), c->n_embd, dt_gpt_ffn(c), c->vocab_size,
             dt_gpt_tied(c) ? "tied" : "untied");
}

void sim_report_ddp(FILE *f, const dt_sim_world *w, const dt_sim_layout_opts *o,
                    const dt_sim_layout *d)
{
    const dt_gpt_config *c = &o->cfg;
    put_setup(f, w, o->nics);
    char model[128];
    model_sizes(c, model, sizeof model);
    fprintf(f, "model          %s: %zu parameters (%.1f MiB of fp32 gradients)\n", model,
            d->params, (double)d->params * 4 / 1048576.0);
    fprintf(f, "batch          %d x %d tokens per rank at %.3g FLOP/s\n", o->micro, o->seq,
            o->flops_per_s);
    fprintf(f, "buckets        %d of up to %.1f MiB, all-reduce by %s\n", d->dp_colls,
            (double)o->bucket_bytes / 1048576.0, d->algos);
    fprintf(f, "compute        forward %.3f ms, backward %.3f ms, optimizer %.3f ms\n",
            d->fwd_s * 1e3, d->bwd_s * 1e3, d->optimizer_s * 1e3);
    fprintf(f, "all-reduces    %.3f ms predicted in all (cost model, one after another, no "
            "contention)\n", d->dp_predicted_s * 1e3);
    double compute = d->fwd_s + d->bwd_s + d->optimizer_s;
    fprintf(f, "step           %.3f ms simulated (compute alone %.3f ms; compute then the "
            "predicted all-reduces %.3f ms)\n", d->step_s * 1e3, compute * 1e3,
            (compute + d->dp_predicted_s) * 1e3);
    char who[32];
    snprintf(who, sizeof who, "rank %d", d->slowest_rank);
    put_split(f, who, &d->slowest, d->step_s);
    put_split(f, "mean rank", &d->mean, d->step_s);
    fprintf(f, "simulator      %.2f s recording, %.2f s running %lld messages (%lld events)\n",
            d->record_s, d->run_s, d->messages, d->events);
}

static void put_layout(FILE *f, const dt_sim_layout_opts *o, const dt_sim_layout *l)
{
    fprintf(f, "layout         tp %d x cp %d x dp %d x pp %d", o->tp, o->cp, o->dp, o->pp);
    if (o->ep > 1) fprintf(f, ", ep %d", o->ep);
    if (o->pp > 1) {
        fprintf(f, ", %s", dt_pp_kind_name(o->sched));
        if (o->V > 1) fprintf(f, " of %d chunks a rank", o->V);
    }
    if (o->zero == 0)
        fprintf(f, ", DDP (buckets of up to %.1f MiB)", (double)o->bucket_bytes / 1048576.0);
    else
        fprintf(f, ", ZeRO-%d%s", o->zero, o->zero == 3 && o->prefetch ? " (prefetch)" : "");
    fprintf(f, "%s\n", o->sp ? ", sequence parallel" : "");
    fprintf(f, "batch          %d micro-batch%s of %d x %d tokens a rank at %.3g FLOP/s\n",
            o->accum, o->accum == 1 ? "" : "es", o->micro, o->seq, o->flops_per_s);
    fprintf(f, "compute        the heaviest stage's forward %.3f ms, backward %.3f ms a "
            "micro-batch; optimizer %.3f ms\n", l->fwd_s * 1e3, l->bwd_s * 1e3,
            l->optimizer_s * 1e3);
    fprintf(f, "collectives    %s (%d recorded)\n", l->algos[0] ? l->algos : "none", l->colls);
    if (o->ep > 1)
        fprintf(f, "experts        %d all-to-alls a step on the busiest rank, %.4g MB of rows to "
                "other ranks (it takes %.2f x the mean rows, an assumption)\n", l->ep_colls,
                l->ep_bytes / 1e6, o->moe_skew);
}

/* Exposed communication by kind, and the idle share (the bubble). */
static void put_kinds(FILE *f, const char *who, const dt_sim_rank_stats *s)
{
    char ep[48] = "";
    if (s->exposed_cls[DT_SIM_CLS_EP] > 0)
        snprintf(ep, sizeof ep, ", expert all-to-alls %.3f ms",
                 s->exposed_cls[DT_SIM_CLS_EP] * 1e3);
    fprintf(f, "  %-12s exposed: tp %.3f ms, pipeline %.3f ms, gradients %.3f ms, gathers "
            "%.3f ms%s\n", who, s->exposed_cls[DT_SIM_CLS_TP] * 1e3,
            s->exposed_cls[DT_SIM_CLS_PP] * 1e3, s->exposed_cls[DT_SIM_CLS_GRADS] * 1e3,
            s->exposed_cls[DT_SIM_CLS_GATHER] * 1e3, ep);
}

void sim_report_layout(FILE *f, const dt_sim_world *w, const dt_sim_layout_opts *o,
                       const dt_sim_layout *l)
{
    const dt_gpt_config *c = &o->cfg;
    put_setup(f, w, o->nics);
    char model[128];
    model_sizes(c, model, sizeof model);
    fprintf(f, "model          %s: %zu parameters, a rank holds up to %zu\n", model, l->params,
            l->params_rank);
    put_layout(f, o, l);
    fprintf(f, "step           %.3f ms simulated (the busiest rank computes %.3f ms of it%s)\n",
            l->step_s * 1e3, l->compute_s * 1e3,
            o->cpu_share > 0 ? " at a core's full rate; shared, its compute takes longer" : "");
    if (o->pp > 1)
        fprintf(f, "pipeline       %d stages; bubble %.3f of the time by the formula (uniform "
                "stages, free messages), idle %.3f on the mean rank\n", l->stages,
                l->bubble_formula, l->mean.idle / l->step_s);
    char who[32];
    snprintf(who, sizeof who, "rank %d", l->slowest_rank);
    put_split(f, who, &l->slowest, l->step_s);
    put_split(f, "mean rank", &l->mean, l->step_s);
    put_kinds(f, "mean rank", &l->mean);
    fprintf(f, "simulator      %.2f s setting up, %.2f s running %lld messages (%lld events)\n",
            l->record_s, l->run_s, l->messages, l->events);
}
