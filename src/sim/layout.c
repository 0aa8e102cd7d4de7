/* A layout's step: checking it, setting it up, running it, summing it up
 * (layout.h; the programs are layout_prog.c's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "model/block.h"
#include "parallel/pipeline/partition.h"
#include "sim/layout_internal.h"

#define MAX_LAYERS 4000 /* the program builder keeps a chunk's segments on the stack */

/* ---- checking ----------------------------------------------------------------- */

static int check_mesh(dt_sim_layout_opts *o, int ranks, char *err, size_t len)
{
    int model = o->tp * o->cp * o->pp;
    if (ranks % model)
        return snprintf(err, len, "--ranks %d is not a multiple of tp x cp x pp = %d (try --ranks "
                        "%d)", ranks, model, (ranks / model + 1) * model), -1;
    if (o->dp && o->dp * model != ranks)
        return snprintf(err, len, "--dp %d: tp x cp x dp x pp = %d, not the %d ranks (--dp %d "
                        "fits)", o->dp, o->dp * model, ranks, ranks / model), -1;
    o->dp = ranks / model;
    return 0;
}

static int check_pipeline(const dt_sim_layout_opts *o, char *err, size_t len)
{
    int L = o->cfg.n_layer, S = o->pp * o->V;
    if (o->V > 1 && (o->pp < 2 || o->sched != DT_PP_INTERLEAVED))
        return snprintf(err, len, "--pp-virtual %d needs --pp-schedule interleaved and --pp 2 "
                        "or more", o->V), -1;
    if (L > MAX_LAYERS)
        return snprintf(err, len, "%d layers: the simulator takes at most %d", L, MAX_LAYERS), -1;
    if (S > L)
        return snprintf(err, len, "%d stages (pp %d x %d chunks) for %d layers: each stage needs "
                        "a layer (try --pp %d)", S, o->pp, o->V, L, L / o->V > 1 ? L / o->V : 1),
               -1;
    if (o->sched == DT_PP_INTERLEAVED && o->pp > 1 && L % S)
        return snprintf(err, len, "interleaved stages must be equal: %d layers do not split into "
                        "%d stages (pp x --pp-virtual)", L, S), -1;
    if (o->pp < 2) return 0;
    dt_pp_schedule s;
    if (dt_pp_schedule_build(&s, o->sched, o->pp, o->V, o->accum, err, len)) return -1;
    dt_pp_schedule_free(&s);
    return 0;
}

/* Expert parallelism as the mesh takes it: ep consecutive data-parallel
 * ranks splitting each layer's experts evenly. */
static int check_ep(const dt_sim_layout_opts *o, char *err, size_t len)
{
    const int E = o->cfg.moe.experts;
    if (o->ep <= 1) return 0;
    if (!E)
        return snprintf(err, len, "--ep %d splits a mixture of experts: the model has none (add "
                        "--num-experts E)", o->ep), -1;
    if (o->dp % o->ep || E % o->ep)
        return snprintf(err, len, "--ep %d must divide the data-parallel size %d and the %d "
                        "experts", o->ep, o->dp, E), -1;
    return 0;
}

int dt_sim_layout_check(dt_sim_layout_opts *o, int ranks, char *err, size_t len)
{
    if (o->tp < 1 || o->cp < 1 || o->pp < 1 || o->V < 1 || o->dp < 0)
        return snprintf(err, len, "--tp, --cp, --pp, --dp and --pp-virtual take 1 or more"), -1;
    if (o->micro < 1 || o->accum < 1)
        return snprintf(err, len, "--batch-size and --grad-accum take 1 or more"), -1;
    if (o->zero < 0 || o->zero > 3)
        return snprintf(err, len, "--zero-stage %d: use 0 (DDP), 1, 2 or 3", o->zero), -1;
    if (check_mesh(o, ranks, err, len) || check_ep(o, err, len)) return -1;
    return check_pipeline(o, err, len);
}

/* ---- groups and their collectives -------------------------------------------- */

/* tp group g: the tp adjacent ranks from g tp. */
static int tp_member(void *ctx, int g, int i)
{
    const dt_sim_layout_opts *o = ctx;
    return g * o->tp + i;
}

/* replicas g = tp_i + tp pp_i: member i = cp_i + cp dp_i, tp apart. */
static int replica_member(void *ctx, int g, int i)
{
    const dt_sim_layout_opts *o = ctx;
    int tp_i = g % o->tp, pp_i = g / o->tp;
    return tp_i + o->tp * i + o->tp * o->cp * o->dp * pp_i;
}

/* ep group g = tp_i + tp (edp_i + edp pp_i): member i is data-parallel
 * rank i + ep edp_i (the mesh's; no cp with ep). */
static int ep_member(void *ctx, int g, int i)
{
    const dt_sim_layout_opts *o = ctx;
    const int ep = o->ep > 1 ? o->ep : 1, edp = o->dp / ep;
    const int tp_i = g % o->tp, edp_i = g / o->tp % edp, pp_i = g / o->tp / edp;
    return tp_i + o->tp * o->cp * (i + ep * edp_i) + o->tp * o->cp * o->dp * pp_i;
}

int lay_coll_id(lay *L, int over, dt_coll_kind kind, size_t bytes, char *err, size_t len)
{
    for (int i = 0; i < L->ncoll; i++)
        if (L->coll[i].over == over && L->coll[i].kind == kind && L->coll[i].bytes == bytes)
            return i;
    if (L->ncoll == L->capcoll) {
        int cap = L->capcoll ? 2 * L->capcoll : 16;
        lay_coll *v = realloc(L->coll, (size_t)cap * sizeof *v);
        if (!v) return snprintf(err, len, "out of memory"), -1;
        L->coll = v, L->capcoll = cap;
    }
    lay_coll *c = &L->coll[L->ncoll];
    *c = (lay_coll){.over = over, .kind = kind, .bytes = bytes};
    if (dt_sim_group_coll_record(&c->c, &L->groups[over], L->w, kind, L->o->algo, bytes, err,
                                 len))
        return -1;
    return L->ncoll++;
}

/* ---- setting up --------------------------------------------------------------- */

/* Seconds of a layer's and the head's forward of a micro-batch on a rank:
 * its tp x cp share of the FLOPs, a third of forward and backward's. */
static void costs(lay *L)
{
    const dt_sim_layout_opts *o = L->o;
    dt_gpt_config head_only = o->cfg;
    head_only.n_layer = 0;
    double all = dt_gpt_flops_per_token(&o->cfg, o->seq);
    double head = dt_gpt_flops_per_token(&head_only, o->seq);
    double per_rank = (double)o->micro * o->seq / (o->tp * o->cp) / o->flops_per_s / 3;
    L->layer_f = (all - head) / L->L * per_rank;
    L->head_f = head * per_rank;
    L->act_bytes = (double)o->micro * (o->seq / o->cp) * o->cfg.n_embd * sizeof(float);
    L->msg_bytes = L->act_bytes / (o->sp ? o->tp : 1);
}

/* The moe branches of a layer and their exchanges' sizes, with ep > 1. */
static void experts(lay *L)
{
    const dt_sim_layout_opts *o = L->o;
    dt_block b[DT_LAYER_MAX_BLOCKS];
    char err[256];
    int n = o->ep > 1 ? dt_blocks_parse(dt_gpt_blocks(&o->cfg), b, err, sizeof err) : 0;
    for (int i = 0; i < n; i++) L->moe += b[i].kind->experts;
    const double skew = o->moe_skew > 1 ? o->moe_skew : 1;
    L->ep_rows = (size_t)((double)o->micro * o->seq * o->cfg.moe.topk * o->cfg.n_embd *
                          sizeof(float) * skew);
    L->ep_counts = (size_t)o->cfg.moe.experts * sizeof(int32_t);
}

static int segments(lay *L, char *err, size_t len)
{
    dt_gpt m;
    if (dt_gpt_create_layout(&m, &L->o->cfg, DT_PREC_F32, err, len)) return -1;
    L->seg_bytes = malloc(((size_t)L->L + 2) * sizeof *L->seg_bytes);
    for (int s = 0; L->seg_bytes && s < L->L + 2; s++)
        L->seg_bytes[s] = (dt_gpt_segment_start(&m, s + 1) - dt_gpt_segment_start(&m, s)) *
                          sizeof(float);
    dt_gpt_destroy(&m);
    return L->seg_bytes ? 0 : (snprintf(err, len, "out of memory"), -1);
}

/* The schedule: the real action lists, or for one stage each micro-batch's
 * forward and backward in turn. */
static int schedule(lay *L, char *err, size_t len)
{
    const dt_sim_layout_opts *o = L->o;
    if (o->pp > 1) return dt_pp_schedule_build(&L->sch, o->sched, o->pp, o->V, o->accum, err, len);
    L->solo = calloc(2 * (size_t)o->accum, sizeof *L->solo);
    if (!L->solo) return snprintf(err, len, "out of memory"), -1;
    for (int i = 0; i < o->accum; i++) {
        L->solo[2 * i] = (dt_pp_action){DT_PP_F, 0, i, -1};
        L->solo[2 * i + 1] = (dt_pp_action){DT_PP_B, 0, i, -1};
    }
    return 0;
}

static int setup(lay *L, char *err, size_t len)
{
    const dt_sim_layout_opts *o = L->o;
    L->L = o->cfg.n_layer;
    L->S = o->pp * o->V;
    L->tied = dt_gpt_tied(&o->cfg);
    size_t p = (size_t)o->pp;
    L->cut = malloc(((size_t)L->S + 1) * sizeof *L->cut);
    L->compute = calloc(p, sizeof *L->compute);
    L->comm = calloc(p, sizeof *L->comm);
    L->events = calloc(p, sizeof *L->events);
    L->busy = calloc(p, sizeof *L->busy);
    L->opt_s = calloc(p, sizeof *L->opt_s);
    L->held = calloc(p, sizeof *L->held);
    L->dp_n = calloc(p, sizeof *L->dp_n);
    L->dp_pred = calloc(p, sizeof *L->dp_pred);
    L->ep_n = calloc(p, sizeof *L->ep_n);
    L->ep_bytes = calloc(p, sizeof *L->ep_bytes);
    if (!L->cut || !L->compute || !L->comm || !L->events || !L->busy || !L->opt_s || !L->held ||
        !L->dp_n || !L->dp_pred || !L->ep_n || !L->ep_bytes)
        return snprintf(err, len, "out of memory"), -1;
    if (dt_pp_cut_uniform(L->L, L->S, L->cut, err, len) || segments(L, err, len) ||
        schedule(L, err, len))
        return -1;
    costs(L);
    experts(L);
    if (dt_sim_groups_init(&L->groups[LAY_TP], L->w, o->tp, tp_member, (void *)o, err, len) ||
        dt_sim_groups_init(&L->groups[LAY_EP], L->w, o->ep > 1 ? o->ep : 1, ep_member, (void *)o,
                           err, len))
        return -1;
    return dt_sim_groups_init(&L->groups[LAY_REPLICAS], L->w, o->cp * o->dp, replica_member,
                              (void *)o, err, len);
}

static void teardown(lay *L)
{
    for (int i = 0; i < L->ncoll; i++) dt_sim_group_coll_free(&L->coll[i].c);
    free(L->coll);
    for (int r = 0; L->compute && r < L->o->pp; r++) dt_sim_prog_free(&L->compute[r]);
    for (int r = 0; L->comm && r < L->o->pp; r++) dt_sim_prog_free(&L->comm[r]);
    free(L->compute), free(L->comm), free(L->events), free(L->busy), free(L->opt_s);
    free(L->held), free(L->cut), free(L->seg_bytes), free(L->solo);
    free(L->dp_n), free(L->dp_pred), free(L->ep_n), free(L->ep_bytes);
    if (L->o->pp > 1) dt_pp_schedule_free(&L->sch);
    for (int g = 0; g < LAY_GROUPS; g++) dt_sim_groups_free(&L->groups[g]);
}

/* ---- running and summing up ---------------------------------------------------- */

static void name_algos(const lay *L, dt_sim_layout *out)
{
    static const char *const over[] = {"tp", "dp", "ep"};
    for (int i = 0; i < L->ncoll; i++) {
        char one[64];
        snprintf(one, sizeof one, "%s %s", over[L->coll[i].over], L->coll[i].c.by_shape[0].label);
        if (strstr(out->algos, one)) continue;
        size_t n = strlen(out->algos);
        snprintf(out->algos + n, sizeof out->algos - n, "%s%s", n ? "; " : "", one);
    }
}

static void summarize(const lay *L, const dt_sim_engine *e, dt_sim_layout *out)
{
    int ranks = L->w->ranks, busiest = 0;
    out->step_s = dt_sim_engine_makespan(e);
    for (int r = 0; r < ranks; r++) {
        const dt_sim_rank_stats *st = dt_sim_engine_stats(e, r);
        if (r == 0 || st->finish > out->slowest.finish) out->slowest = *st, out->slowest_rank = r;
        out->mean.compute += st->compute / ranks;
        out->mean.exposed += st->exposed / ranks;
        out->mean.idle += st->idle / ranks;
        out->mean.finish += st->finish / ranks;
        for (int k = 0; k < DT_SIM_CLASSES; k++)
            out->mean.exposed_cls[k] += st->exposed_cls[k] / ranks;
    }
    for (int r = 1; r < L->o->pp; r++)
        if (L->busy[r] > L->busy[busiest]) busiest = r;
    out->compute_s = L->busy[busiest];
    out->optimizer_s = L->opt_s[busiest];
    out->dp_colls = L->dp_n[busiest];
    out->dp_predicted_s = L->dp_pred[busiest];
    out->ep_colls = L->ep_n[busiest];
    out->ep_bytes = L->ep_bytes[busiest];
    out->colls = L->ncoll;
    name_algos(L, out);
    long long changes;
    dt_sim_engine_counts(e, &out->events, &out->messages, &changes);
}

static int run_engine(lay *L, dt_sim_span_fn span, void *ctx, dt_sim_layout *out, char *err,
                      size_t len)
{
    int events = 1;
    for (int r = 0; r < L->o->pp; r++)
        if (L->events[r] + 1 > events) events = L->events[r] + 1;
    dt_sim_engine *e = dt_sim_engine_new(L->w, L->o->nics, 2, events, err, len);
    if (!e) return -1;
    int rc = 0;
    if (L->o->cpu_share > 0 && dt_sim_engine_share_cpu(e, L->o->cpu_share))
        rc = -1, snprintf(err, len, "out of memory for the hosts' cores");
    for (int i = 0; rc == 0 && i < L->ncoll; i++)
        if (dt_sim_engine_add_group_coll(e, &L->coll[i].c) != i)
            rc = -1, snprintf(err, len, "out of memory for the collectives");
    int stride = L->o->tp * L->o->cp * L->o->dp;
    for (int r = 0; rc == 0 && r < L->w->ranks; r++) {
        dt_sim_engine_program(e, r, 0, &L->compute[r / stride]);
        dt_sim_engine_program(e, r, 1, &L->comm[r / stride]);
    }
    dt_sim_engine_on_span(e, span, ctx);
    uint64_t t0 = dt_now_ns();
    if (rc == 0) rc = dt_sim_engine_run(e, err, len);
    out->run_s = (double)(dt_now_ns() - t0) * 1e-9;
    if (rc == 0) summarize(L, e, out);
    dt_sim_engine_free(e);
    return rc;
}

static void model_figures(const lay *L, dt_sim_layout *out)
{
    const dt_sim_layout_opts *o = L->o;
    for (int s = 0; s < L->L + 2; s++) out->params += L->seg_bytes[s] / sizeof(float);
    for (int r = 0; r < o->pp; r++)
        if (L->held[r] > out->params_rank) out->params_rank = L->held[r];
    out->stages = L->S;
    for (int k = 0; k < L->S; k++) {
        int layers = L->cut[k + 1] - L->cut[k];
        double f = layers * L->layer_f + (k == L->S - 1 ? L->head_f : 0);
        if (f > out->fwd_s) out->fwd_s = f;
    }
    out->bwd_s = 2 * out->fwd_s;
    out->bubble_formula = o->pp > 1 ? dt_pp_bubble_formula(o->sched, o->pp, o->V, o->accum) : 0;
}

int dt_sim_layout_run(dt_sim_world *w, const dt_sim_layout_opts *o, dt_sim_span_fn span,
                      void *ctx, dt_sim_layout *out, char *err, size_t len)
{
    memset(out, 0, sizeof *out);
    lay L = {.o = o, .w = w};
    uint64_t t0 = dt_now_ns();
    int rc = setup(&L, err, len);
    for (int r = 0; rc == 0 && r < o->pp; r++) rc = lay_programs(&L, r, err, len);
    out->record_s = (double)(dt_now_ns() - t0) * 1e-9;
    if (rc == 0) model_figures(&L, out);
    if (rc == 0) rc = run_engine(&L, span, ctx, out, err, len);
    teardown(&L);
    return rc;
}
