/* The layouts `dtrain plan` weighs: every combination of sizes and modes
 * that a run of this model on this cluster would accept. See plan.h. */
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "plan/plan.h"

#define MAX_LAYOUTS (1 << 20)

typedef struct {
    dt_plan_layout *v;
    int n, cap;
} list;

/* Whether l has what the user fixed. */
static int pinned_out(const dt_plan_input *in, const dt_plan_layout *l)
{
    const int have[] = {l->tp, l->cp, l->pp, l->zero, l->B, (int)l->rc,
                        l->pp > 1 ? (int)l->sched : -2};
    const int want[] = {in->pin.tp, in->pin.cp, in->pin.pp, in->pin.zero, in->pin.B, in->pin.rc,
                        in->pin.sched};
    for (size_t i = 0; i < sizeof have / sizeof have[0]; i++)
        if (want[i] >= 0 && have[i] != want[i] && have[i] != -2) return 1;
    return 0;
}

static int push(const dt_plan_input *in, list *L, const dt_plan_layout *l)
{
    if (pinned_out(in, l)) return 0;
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

/* Tensor parallelism splits heads, the MLP and the vocabulary, inside a
 * host (its reduces run several times a layer). */
static int tp_ok(const dt_plan_input *in, int tp)
{
    const dt_gpt_config *m = &in->model;
    int limit = in->max_tp > 0 ? in->max_tp : in->per_node;
    return tp <= limit && m->n_head % tp == 0 && (4 * m->n_embd) % tp == 0 &&
           (m->vocab_size + tp - 1) / tp * (tp - 1) < m->vocab_size;
}

/* Ring attention's zig-zag cut: 2 cp chunks of each sequence. */
static int cp_ok(const dt_plan_input *in, int cp) { return cp <= 16 && in->T % (2 * cp) == 0; }

/* The schedules a pipeline of pp stages could run with M micro-batches,
 * and their chunks a rank: V = 2 for interleaved. */
static int schedules(const dt_plan_input *in, int pp, int M, dt_pp_kind *kind, int *V)
{
    int n = 0, L = in->model.n_layer;
    kind[n] = DT_PP_1F1B, V[n++] = 1;
    kind[n] = DT_PP_ZB1P, V[n++] = 1;
    if (M % pp == 0 && L % (2 * pp) == 0) kind[n] = DT_PP_INTERLEAVED, V[n++] = 2;
    return n;
}

/* The modes of one shape: ZeRO stages (2 and 3 not inside a pipeline) and
 * recomputation. */
static int modes(const dt_plan_input *in, list *L, dt_plan_layout l)
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
            if (push(in, L, &l)) return -1;
        }
    return 0;
}

/* The micro-batches of one data-parallel block's share of the batch. */
static int shapes(const dt_plan_input *in, list *L, dt_plan_layout l)
{
    const long per = in->batch / l.dp;
    for (long B = 1; B <= per && B <= 64; B++) {
        if (per % B) continue;
        l.B = (int)B;
        l.M = (int)(per / B);
        /* Sequence parallelism splits each micro-batch's rows over tp. */
        if (l.sp && ((long)B * (in->T / l.cp)) % l.tp) continue;
        if (l.pp == 1) {
            l.sched = DT_PP_1F1B, l.V = 1;
            if (modes(in, L, l)) return -1;
            continue;
        }
        dt_pp_kind kind[3];
        int V[3], ns = schedules(in, l.pp, l.M, kind, V);
        for (int s = 0; s < ns; s++) {
            l.sched = kind[s], l.V = V[s];
            if (modes(in, L, l)) return -1;
        }
    }
    return 0;
}

int dt_plan_layouts(const dt_plan_input *in, dt_plan_layout **out, int *n, char *err,
                    size_t errlen)
{
    const int world = in->nodes * in->per_node;
    list L = {0};
    for (int tp = 1; tp <= world; tp++) {
        if (world % tp || !tp_ok(in, tp)) continue;
        for (int pp = 1; pp <= world / tp && pp <= 64; pp++) {
            if ((world / tp) % pp || pp > in->model.n_layer) continue;
            for (int cp = 1; cp <= world / (tp * pp); cp *= 2) {
                if ((world / (tp * pp)) % cp || !cp_ok(in, cp)) continue;
                dt_plan_layout l = {.tp = tp, .cp = cp, .pp = pp, .dp = world / (tp * pp * cp),
                                    .sp = tp > 1};
                if (in->batch % l.dp) continue;
                if (shapes(in, &L, l)) {
                    free(L.v);
                    return dt_strf(err, errlen, "plan: more than %d layouts (or out of "
                                   "memory); narrow the search", MAX_LAYOUTS), -1;
                }
            }
        }
    }
    if (L.n == 0)
        return dt_strf(err, errlen, "no layout of %d ranks %s: the data-parallel size "
                       "must divide the batch of %ld sequences, tp the %d heads and the ranks "
                       "of a host, pp the %d layers, 2 cp the sequence of %d; use a batch that "
                       "%d divides%s", world,
                       in->pin.tp > 0 || in->pin.pp > 0 || in->pin.cp > 0 || in->pin.B > 0
                           ? "has the sizes asked for" : "splits this batch",
                       in->batch, in->model.n_head, in->model.n_layer, in->T, world,
                       in->pin.tp > 0 || in->pin.pp > 0 || in->pin.cp > 0 || in->pin.B > 0
                           ? ", or fix fewer sizes" : ", or fewer ranks"), -1;
    *out = L.v;
    *n = L.n;
    return 0;
}

void dt_plan_layout_name(const dt_plan_layout *l, char *buf, size_t n)
{
    static const char *rc[] = {"none", "selective", "full"};
    char sched[48] = "";
    if (l->pp > 1)
        dt_strf(sched, sizeof sched, ", %s%s", dt_pp_kind_name(l->sched),
                l->V > 1 ? " V 2" : "");
    dt_strf(buf, n, "tp %d x cp %d x dp %d x pp %d%s, ZeRO-%d, micro-batch %d x %d%s, "
            "recompute %s", l->tp, l->cp, l->dp, l->pp, l->sp ? " sp" : "", l->zero, l->B,
            l->M, sched, rc[l->rc]);
}
