/* A layout's step time for `dtrain plan`, from the products' FLOPs at the
 * rank's sustained rate and the cost model's seconds for what the mesh
 * moves. See plan.h; docs/plan.md gives the formulas.
 *
 * A micro-batch's forward on a rank (one chunk of a pipeline's stages) is
 * its share of the products, B T / (tp cp) tokens at the chunk's FLOPs a
 * token, plus what cannot overlap it: tensor parallelism's two reduces a
 * layer (the activations, fp32 as dtrain moves them) and context
 * parallelism's exchange beyond its attention. Backward is twice the
 * forward's products and the same reduces (full recomputation adds the
 * layers' forward again). The pipeline's schedule, simulated with those
 * costs, gives the compute with its bubble; each stage boundary's message
 * is paid once filling and once draining. Data parallelism's reduction
 * overlaps the last micro-batch's backward; what is left shows, and so do
 * ZeRO-1/2's all-gather after the update and ZeRO-3's gathers beyond the
 * compute they hide behind. The optimizer streams 28 bytes a parameter
 * it updates (AdamW reads the parameter, its gradient and two moments and
 * writes three) at the rank's memory rate; selective recomputation's
 * element-wise work streams at that rate too. With more ranks on a host
 * than cores, the compute is at least the host's work over its cores;
 * with no core to spare, the collectives take turns with the compute.
 * Expert parallelism's all-to-alls (the counts, then the rows out to the
 * experts and back, forward and backward) sit between the router and the
 * experts, so nothing hides them: they add to the chunk's passes. */
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "model/block.h"
#include "plan/plan.h"
#include "plan/plan_internal.h"
#include "plan/pp_figures.h"

#define OPT_BYTES_PER_PARAM 28.0

/* The memo's lists of (kind, p, V) at a count of micro-batches. */
typedef struct {
    dt_plan_memo *c;
    dt_pp_kind kind;
    int p, V;
} lists_of;

static const dt_pp_schedule *lists(void *ctx, int M, char *err, size_t errlen)
{
    const lists_of *x = ctx;
    const dt_plan_sched *s = dt_plan_sched_of(x->c, x->kind, x->p, x->V, M, 0, err, errlen);
    return s ? &s->s : NULL;
}

/* The schedule's makespan in units of a chunk's forward, B the backward
 * (I = W = B / 2 for zb1p), from lists of a bounded length whatever M
 * (pp_figures.h), each built once; remembered. -1 when it does not
 * build. */
static double makespan(dt_plan_memo *c, dt_pp_kind kind, int p, int V, int M, double bwd)
{
    for (int i = 0; i < c->nspans; i++) {
        const dt_plan_span *s = &c->spans[i];
        if (s->kind == (int)kind && s->p == p && s->V == V && s->M == M && s->bwd == bwd)
            return s->makespan;
    }
    char err[256];
    const double cost[4] = {1, bwd, bwd / 2, bwd / 2};
    lists_of x = {c, kind, p, V};
    double span;
    if (dt_plan_pp_makespan(kind, p, V, M, cost, lists, &x, &span, err, sizeof err)) span = -1;
    if (c->nspans == c->capspans) {
        int cap = c->capspans ? 2 * c->capspans : 64;
        dt_plan_span *v = realloc(c->spans, (size_t)cap * sizeof *v);
        if (!v) return span;
        c->spans = v, c->capspans = cap;
    }
    c->spans[c->nspans++] = (dt_plan_span){(int)kind, p, V, M, bwd, span};
    return span;
}

typedef struct {
    double fwd, bwd;     /* seconds of a chunk's forward and backward, products only */
    double tp_f, tp_b;   /* tensor parallelism's reduces in them */
    double cp_f, cp_b;   /* context parallelism's exchange beyond its attention */
    double ep_f, ep_b;   /* expert parallelism's all-to-alls */
} chunk_cost;

/* The moe branches of a layer (0: a dense model). */
static int moe_per_layer(const dt_gpt_config *m)
{
    dt_block b[DT_LAYER_MAX_BLOCKS];
    char err[256];
    int n = m->moe.experts ? dt_blocks_parse(dt_gpt_blocks(m), b, err, sizeof err) : 0, k = 0;
    for (int i = 0; i < n; i++) k += b[i].kind->experts;
    return k;
}

/* Bytes of one of a moe branch's row exchanges on the busiest ep rank:
 * each of the micro-batch's B T tokens sends its K routing slots' rows
 * of C floats, and the skewed router brings that rank moe_skew times the
 * mean back. */
static double ep_exchange_bytes(const dt_plan_input *in, const dt_plan_layout *l)
{
    const dt_gpt_config *m = &in->model;
    const double skew = in->moe_skew > 1 ? in->moe_skew : 1;
    return (double)l->B * in->T * m->moe.topk * m->n_embd * sizeof(float) * skew;
}

/* Seconds of one moe branch's all-to-alls in a micro-batch's forward (the
 * counts, dispatch, combine) and backward (dispatch and combine of the
 * gradients), over the ep group: consecutive data-parallel ranks, tp x cp
 * apart. Until the variable all-to-all (dt_alltoallv) is in comm/, the
 * rows are priced as the even all-to-all of the busiest rank's size. */
static void ep_exchanges(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l,
                         double *fwd, double *bwd)
{
    *fwd = *bwd = 0;
    if (l->ep < 2) return;
    const int near = dt_plan_group_per_host(in->per_node, l->tp * l->cp, l->ep);
    const size_t rows = (size_t)ep_exchange_bytes(in, l);
    const size_t counts = (size_t)in->model.moe.experts * sizeof(int32_t);
    const double a2a = dt_plan_coll(c, DT_COLL_ALLTOALL, l->ep, near, rows);
    *fwd = dt_plan_coll(c, DT_COLL_ALLTOALL, l->ep, near, counts) + 2 * a2a;
    *bwd = 2 * a2a;
}

/* Floats a row of a layer's element-wise buffers (the norms' outputs, the
 * MLP's activation: GPT-2's C, C and 4 C, Llama's C, C and F), what
 * selective recomputation forms again, from the kinds' own lists
 * (model/block.h): the growth of one row more. */
static double elementwise_row(const dt_gpt *m)
{
    dt_act_spec one[DT_BLOCK_MAX_ACTS], two[DT_BLOCK_MAX_ACTS];
    double floats = 0;
    for (int i = 0; i < m->n_blocks; i++) {
        const dt_block_kind *k = m->blocks[i].kind;
        const int n = k->acts(m, 1, 0, one);
        k->acts(m, 2, 0, two);
        for (int j = 0; j < n; j++)
            if (one[j].cls == DT_ACT_ELEMENTWISE)
                floats += (double)two[j].floats - (double)one[j].floats;
    }
    return floats;
}

/* The chunk that costs most: the last one, with its layers and the head. */
static void chunk_of(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l,
                     chunk_cost *k)
{
    const dt_gpt_config *m = &in->model;
    const double C = m->n_embd, T = in->T, V = m->vocab_size;
    const int stages = l->pp * l->V;
    const double layers = (double)((m->n_layer + stages - 1) / stages);
    const double tokens = (double)l->B * T / (l->tp * l->cp);
    const double layer_tok = dt_gpt_layer_flops_per_token(m, in->T), head_tok = 6 * V * C;
    const double flops = tokens * (layers * layer_tok + head_tok);
    k->fwd = flops / 3 / in->flops;
    k->bwd = 2 * flops / 3 / in->flops;
    if (l->rc == DT_RECOMPUTE_FULL) k->bwd += tokens * layers * layer_tok / 3 / in->flops;
    /* selective: the norms and the MLP's activation again, memory-bound:
     * each reads and writes its rows */
    if (l->rc == DT_RECOMPUTE_SELECTIVE)
        k->bwd += layers * 2 * elementwise_row(&c->whole) * sizeof(float) * tokens * l->tp /
                  in->opt_Bps;
    /* tp: two reduces of the micro-batch's rows a layer, each way */
    const size_t act = (size_t)l->B * (size_t)(T / l->cp) * (size_t)C * sizeof(float);
    double ar = dt_plan_coll(c, DT_COLL_ALLREDUCE, l->tp,
                             dt_plan_group_per_host(in->per_node, 1, l->tp), act);
    k->tp_f = 2 * layers * ar * (l->rc == DT_RECOMPUTE_FULL ? 2 : 1);
    k->tp_b = 2 * layers * ar;
    /* cp: a ring of cp - 1 exchanges of the rank's k and v (backward: and
     * their gradients), hidden behind attention's products as far as they
     * go; C wide each under grouped-query attention too, since the
     * attention packs k and v repeated to the query heads (rope_attention) */
    const int cp_near = l->tp * l->cp <= in->per_node;
    double kv = l->cp > 1 ? (l->cp - 1) * dt_plan_p2p(c, cp_near, 2 * act / (size_t)l->tp) : 0;
    double attn = tokens * layers * 2 * T * C / in->flops; /* forward attention products */
    k->cp_f = kv * layers > attn ? kv * layers - attn : 0;
    k->cp_b = 2 * kv * layers > 2 * attn ? 2 * kv * layers - 2 * attn : 0;
    /* ep: each moe branch's exchanges; full recomputation runs the forward's again */
    double ef, eb;
    ep_exchanges(in, c, l, &ef, &eb);
    const double branches = layers * moe_per_layer(m);
    k->ep_f = branches * ef;
    k->ep_b = branches * (eb + (l->rc == DT_RECOMPUTE_FULL ? ef : 0));
}

/* Data parallelism's reduction of the rank's gradients over the replicas
 * (cp x dp ranks, tp apart), and ZeRO's gathers: what shows beyond the
 * backward it overlaps (`hide` seconds). */
static double data_parallel(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l,
                            size_t psi, double hide, double compute)
{
    const int n = l->cp * l->dp, near = dt_plan_group_per_host(in->per_node, l->tp, n);
    const size_t grads = psi * (in->bf16 ? 2 : 4), params = psi * (in->bf16 ? 2 : 4);
    if (n < 2) return 0;
    if (in->cpu_comm) hide = compute = 0; /* no core to hide behind */
    double rs = dt_plan_coll(c, DT_COLL_REDUCE_SCATTER, n, near, grads);
    double ag = dt_plan_coll(c, DT_COLL_ALLGATHER, n, near, params);
    if (l->zero == 0) {
        double ar = dt_plan_coll(c, DT_COLL_ALLREDUCE, n, near, grads);
        return ar > hide ? ar - hide : 0;
    }
    if (l->zero < 3) return (rs > hide ? rs - hide : 0) + ag;
    /* stage 3: gathers before forward and backward, the reduce-scatter in
     * backward, behind the compute but for the first layer's gather */
    double all = 2 * ag + rs, first = ag / (in->model.n_layer + 1);
    return (all > compute ? all - compute : 0) + first;
}

int dt_plan_time(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l,
                 dt_plan_row *row, char *err, size_t errlen)
{
    chunk_cost k;
    chunk_of(in, c, l, &k);
    const double F = k.fwd + k.tp_f + k.cp_f + k.ep_f, Bw = k.bwd + k.tp_b + k.cp_b + k.ep_b;
    double span;
    if (l->pp > 1) {
        span = makespan(c, l->sched, l->pp, l->V, l->M, Bw / F);
        if (span < 0)
            return dt_strf(err, errlen, "plan: the %s schedule of p %d, V %d, M %d does not "
                           "build", dt_pp_kind_name(l->sched), l->pp, l->V, l->M), -1;
        span *= F;
    } else {
        span = l->M * (F + Bw);
    }
    /* More ranks than cores: the host's cores run every rank's work in
     * turn, and a rank idle in the bubble hands its core to another. */
    const double busy = l->M * (F + Bw) * l->V;
    const int shared = in->cores > 0 && in->per_node > in->cores &&
                       busy * in->per_node / in->cores > span;
    if (shared) span = busy * in->per_node / in->cores;
    /* a stage boundary's message, paid filling and draining */
    const int stride = l->tp * l->cp * l->dp;
    const size_t msg = (size_t)l->B * (size_t)(in->T / l->cp) * (size_t)in->model.n_embd *
                       sizeof(float) / (size_t)(l->sp ? l->tp : 1);
    row->pp_s = l->pp > 1 ? 2.0 * (l->pp * l->V - 1) *
                                dt_plan_p2p(c, stride < in->per_node, msg) : 0;
    row->tp_s = l->M * (k.tp_f + k.tp_b) * l->V;
    row->cp_s = l->M * (k.cp_f + k.cp_b) * l->V;
    row->ep_s = l->M * (k.ep_f + k.ep_b) * l->V;
    row->compute = l->M * (k.fwd + k.bwd) * l->V;
    double idle = span - row->compute - row->tp_s - row->cp_s - row->ep_s;
    if (idle < 0) idle = 0;
    row->bubble = shared ? 0 : idle;
    row->cores_s = shared ? idle : 0;
    row->dp_s = data_parallel(in, c, l, row->psi, k.bwd * l->V, span);
    const size_t updated = l->zero > 0 ? row->psi / (size_t)(l->cp * l->dp) : row->psi;
    row->opt_s = OPT_BYTES_PER_PARAM * (double)updated / in->opt_Bps;
    row->step = span + row->pp_s + row->dp_s + row->opt_s;
    /* the rows' four exchanges a branch, (ep - 1) / ep of them off the rank */
    const double rank_layers = (double)((in->model.n_layer + l->pp - 1) / l->pp);
    row->ep_bytes = l->ep > 1 ? 4.0 * rank_layers * moe_per_layer(&in->model) * l->M *
                                    ep_exchange_bytes(in, l) * (l->ep - 1) / l->ep : 0;
    row->tokens_per_s = (double)in->batch * in->T / row->step;
    return 0;
}
