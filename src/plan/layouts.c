/* The layouts `dtrain plan` weighs: every combination of sizes and modes
 * that a run of this model on this cluster would accept. See plan.h. */
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "plan/plan.h"
#include "plan/plan_internal.h"

#define MAX_LAYOUTS (1 << 20)

/* Each layout with what the user fixed goes to visit. */
typedef struct {
    const dt_plan_input *in;
    dt_plan_visit visit;
    void *ctx;
} walk;

/* Whether l has what the user fixed. */
static int pinned_out(const dt_plan_input *in, const dt_plan_layout *l)
{
    const int have[] = {l->tp, l->cp, l->pp, l->zero, l->B, (int)l->rc,
                        l->pp > 1 ? (int)l->sched : -2, l->ep};
    const int want[] = {in->pin.tp, in->pin.cp, in->pin.pp, in->pin.zero, in->pin.B, in->pin.rc,
                        in->pin.sched, in->pin.ep};
    for (size_t i = 0; i < sizeof have / sizeof have[0]; i++)
        if (want[i] >= 0 && have[i] != want[i] && have[i] != -2) return 1;
    return 0;
}

static int push(const walk *W, const dt_plan_layout *l)
{
    return pinned_out(W->in, l) ? 0 : W->visit(W->ctx, l);
}

/* Tensor parallelism splits the query heads with their key/value heads
 * (whole groups a rank), the MLP (each expert as it) and the vocabulary,
 * inside a host (its reduces run several times a layer): as
 * dt_gpt_set_tp takes them. */
static int tp_ok(const dt_plan_input *in, int tp)
{
    const dt_gpt_config *m = &in->model;
    int limit = in->max_tp > 0 ? in->max_tp : in->per_node;
    const int experts = m->moe.ffn ? m->moe.ffn : 4 * m->n_embd; /* an expert's width */
    return tp <= limit && m->n_head % tp == 0 && dt_gpt_kv_heads(m) % tp == 0 &&
           dt_gpt_ffn(m) % tp == 0 && (!m->moe.experts || experts % tp == 0) &&
           (m->vocab_size + tp - 1) / tp * (tp - 1) < m->vocab_size;
}

/* Ring attention's zig-zag cut: 2 cp chunks of each sequence; without
 * context parallelism nothing is cut. */
static int cp_ok(const dt_plan_input *in, int cp)
{
    return cp == 1 || (cp <= 16 && in->T % (2 * cp) == 0);
}

/* Expert parallelism takes ep consecutive data-parallel ranks (the mesh)
 * and splits each layer's experts evenly over them. */
static int ep_ok(const dt_plan_input *in, const dt_plan_layout *l, int ep)
{
    const int E = in->model.moe.experts;
    return ep == 1 || (E && l->dp % ep == 0 && E % ep == 0);
}

/* The schedules a pipeline of pp stages could run with M micro-batches,
 * and their chunks a rank: V = 2 for interleaved. */
static int schedules(const dt_plan_input *in, int pp, int M, dt_pp_kind *kind, int *V)
{
    static const dt_pp_kind kinds[] = {DT_PP_1F1B, DT_PP_ZB1P, DT_PP_INTERLEAVED};
    int n = 0;
    char err[256];
    for (int i = 0; i < 3; i++) {
        kind[n] = kinds[i], V[n] = kinds[i] == DT_PP_INTERLEAVED ? 2 : 1;
        if (V[n] > 1 && in->model.n_layer % (V[n] * pp)) continue;
        /* as a run refuses them: interleaved's M a multiple of pp, M V at most 2^20 */
        if (dt_pp_schedule_valid(kind[n], pp, V[n], M, err, sizeof err) == 0) n++;
    }
    return n;
}

/* The modes of one shape: ZeRO stages (2 and 3 not inside a pipeline) and
 * recomputation. */
static int modes(const walk *W, dt_plan_layout l)
{
    static const dt_recompute rcs[] = {DT_RECOMPUTE_NONE, DT_RECOMPUTE_SELECTIVE,
                                       DT_RECOMPUTE_FULL};
    const int zmax = l.pp > 1 ? 1 : 3;
    /* the stage innermost: the planner reuses a shape's holdings across it */
    for (int r = 0; r < 3; r++)
        for (int z = 0; z <= zmax; z++) {
            if (z > 0 && l.dp * l.cp == 1) break; /* nothing to shard over */
            l.zero = z;
            l.rc = rcs[r];
            if (push(W, &l)) return -1;
        }
    return 0;
}

/* The micro-batches of one data-parallel block's share of the batch. */
static int shapes(const walk *W, dt_plan_layout l)
{
    const dt_plan_input *in = W->in;
    const long per = in->batch / l.dp;
    for (long B = 1; B <= per && B <= 64; B++) {
        if (per % B) continue;
        l.B = (int)B;
        l.M = (int)(per / B);
        /* Sequence parallelism splits each micro-batch's rows over tp. */
        if (l.sp && ((long)B * (in->T / l.cp)) % l.tp) continue;
        if (l.pp == 1) {
            l.sched = DT_PP_1F1B, l.V = 1;
            if (modes(W, l)) return -1;
            continue;
        }
        dt_pp_kind kind[3];
        int V[3], ns = schedules(in, l.pp, l.M, kind, V);
        for (int s = 0; s < ns; s++) {
            l.sched = kind[s], l.V = V[s];
            if (modes(W, l)) return -1;
        }
    }
    return 0;
}

int dt_plan_layouts_each(const dt_plan_input *in, dt_plan_visit visit, void *ctx)
{
    const walk W = {in, visit, ctx};
    if ((long)in->nodes * in->per_node > DT_PLAN_MAX_RANKS) return -1;
    const int world = in->nodes * in->per_node;
    const int tp_max = in->max_tp > 0 ? in->max_tp : in->per_node;
    for (int tp = 1; tp <= world && tp <= tp_max; tp++) {
        if (world % tp || !tp_ok(in, tp)) continue;
        for (int pp = 1; pp <= world / tp && pp <= 64; pp++) {
            if ((world / tp) % pp || pp > in->model.n_layer) continue;
            for (int cp = 1; cp <= world / (tp * pp); cp *= 2) {
                if ((world / (tp * pp)) % cp || !cp_ok(in, cp)) continue;
                dt_plan_layout l = {.tp = tp, .cp = cp, .pp = pp, .dp = world / (tp * pp * cp),
                                    .sp = tp > 1};
                if (in->batch % l.dp) continue;
                for (l.ep = 1; l.ep <= l.dp; l.ep++) {
                    if (!ep_ok(in, &l, l.ep)) continue;
                    int rc = shapes(&W, l);
                    if (rc) return rc;
                }
            }
        }
    }
    return 0;
}

typedef struct {
    dt_plan_layout *v;
    int n, cap;
} list;

static int keep(void *ctx, const dt_plan_layout *l)
{
    list *L = ctx;
    if (L->n == L->cap) {
        int cap = L->cap ? 2 * L->cap : 1024;
        if (cap > MAX_LAYOUTS) return -1;
        dt_plan_layout *v = realloc(L->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        L->v = v, L->cap = cap;
    }
    L->v[L->n++] = *l;
    return 0;
}

int dt_plan_layouts(const dt_plan_input *in, dt_plan_layout **out, int *n, char *err,
                    size_t errlen)
{
    const long world = (long)in->nodes * in->per_node;
    if (in->nodes < 1 || in->per_node < 1 || world > DT_PLAN_MAX_RANKS)
        return dt_strf(err, errlen, "plan: %d nodes x %d ranks a node; a plan weighs 1 to %d "
                       "ranks", in->nodes, in->per_node, DT_PLAN_MAX_RANKS), -1;
    list L = {0};
    if (dt_plan_layouts_each(in, keep, &L)) {
        free(L.v);
        return dt_strf(err, errlen, "plan: more than %d layouts (or out of memory); narrow "
                       "the search", MAX_LAYOUTS), -1;
    }
    if (L.n == 0) return dt_plan_no_layout(in, err, errlen);
    *out = L.v;
    *n = L.n;
    return 0;
}

void dt_plan_layout_name(const dt_plan_layout *l, char *buf, size_t n)
{
    char sched[48] = "", ep[24] = "";
    if (l->pp > 1)
        dt_strf(sched, sizeof sched, ", %s%s", dt_pp_kind_name(l->sched),
                l->V > 1 ? " V 2" : "");
    if (l->ep > 1) dt_strf(ep, sizeof ep, " (ep %d)", l->ep);
    dt_strf(buf, n, "tp %d x cp %d x dp %d%s x pp %d%s, ZeRO-%d, micro-batch %d x %d%s, "
            "recompute %s", l->tp, l->cp, l->dp, ep, l->pp, l->sp ? " sp" : "", l->zero, l->B,
            l->M, sched, dt_recompute_name(l->rc));
}
