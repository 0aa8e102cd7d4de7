/* A mixture of experts as a block kind (a branch): a router and E experts
 * of GPT-2's MLP shape (c_fc C -> F, GELU, c_proj F -> C), each row
 * computed by the K experts its router chooses and their outputs summed
 * with the router's renormalized weights (kernels/router.h):
 *
 *     out[i] = sum_k w[i,k] expert_{c[i,k]}(x[i]),   res' = res + out
 *
 * The rows are sorted by expert, each expert's a contiguous run, so its
 * two products are one call each over its rows (grouped, no padding;
 * an expert with no rows costs nothing).
 * Tensors: router.weight [E, C] (Linear layout: logits = x Wr^T), then
 * per expert experts.{e}.c_fc.weight [C, F], .c_fc.bias [F],
 * .c_proj.weight [F, C], .c_proj.bias [C] (GPT-2's Conv1D layout).
 * Buffers, N rows, S = N K routing slots (an upper bound: dropped slots
 * take no rows):
 *   res [N, C]      the residual sum after it                  PRODUCT
 *   logits [N, E]   the router's product                        PRODUCT
 *   probs [N E + N] softmax and log-sum-exp                     ELEMENTWISE
 *   route           choice, weight, keep, pos [N K] each,
 *                   order [N K], count [E]                      ELEMENTWISE
 *   xs [S, C]       the rows gathered in expert order           ELEMENTWISE
 *   h [S, F]        c_fc's output                               PRODUCT
 *   g [S, F]        GELU's                                      ELEMENTWISE
 *   y [S, C]        c_proj's                                    PRODUCT
 *   d_y, d_h, d_lg  SPLIT: the products' output gradients for the weight half
 *   dyx [S, C], dg [S, F], dw [N K], dlg [N, E]                 SCRATCH */
#include <string.h>

#include "core/str.h"
#include "kernels/gelu.h"
#include "kernels/router.h"
#include "model/model_internal.h"

enum { RES, LOGITS, PROBS, ROUTE, XS, H, G, Y, D_Y, D_H, D_LG, DYX, DG, DW, DLG, N_ACTS };
enum { ROUTER, FC_W, FC_B, PROJ_W, PROJ_B }; /* expert e's tensor j: 1 + 4 e + (j - 1) */

#define W_(c, e, j) ((c)->w[1 + 4 * (e) + ((j) - 1)])
#define G_(c, e, j) ((c)->g[1 + 4 * (e) + ((j) - 1)])

static int ffn(const dt_gpt_config *cfg)
{
    return cfg->moe.ffn > 0 ? cfg->moe.ffn : 4 * cfg->n_embd;
}

static int tensors(const dt_gpt_config *cfg, const dt_gpt_tp *tp, dt_tensor_spec *out)
{
    (void)tp;
    const int C = cfg->n_embd, E = cfg->moe.experts, F = ffn(cfg);
    out[0] = (dt_tensor_spec){"router.weight", E, C, {0}, DT_INIT_NORMAL};
    for (int e = 0; e < E; e++) {
        dt_tensor_spec *t = out + 1 + 4 * e;
        t[0] = (dt_tensor_spec){"", C, F, {0}, DT_INIT_NORMAL};
        t[1] = (dt_tensor_spec){"", F, 0, {0}, DT_INIT_ZERO};
        t[2] = (dt_tensor_spec){"", F, C, {0}, DT_INIT_RESIDUAL};
        t[3] = (dt_tensor_spec){"", C, 0, {0}, DT_INIT_ZERO};
        dt_strf(t[0].name, sizeof t[0].name, "experts.%d.c_fc.weight", e);
        dt_strf(t[1].name, sizeof t[1].name, "experts.%d.c_fc.bias", e);
        dt_strf(t[2].name, sizeof t[2].name, "experts.%d.c_proj.weight", e);
        dt_strf(t[3].name, sizeof t[3].name, "experts.%d.c_proj.bias", e);
    }
    return 1 + 4 * E;
}

static int acts(const dt_gpt *m, size_t N, size_t R, dt_act_spec *out)
{
    const size_t C = (size_t)m->cfg.n_embd, E = (size_t)m->cfg.moe.experts;
    const size_t K = (size_t)m->cfg.moe.topk, F = (size_t)ffn(&m->cfg), S = N * K;
    out[RES] = (dt_act_spec){R * C, DT_ACT_PRODUCT};
    out[LOGITS] = (dt_act_spec){N * E, DT_ACT_PRODUCT};
    out[PROBS] = (dt_act_spec){N * E + N, DT_ACT_ELEMENTWISE};
    out[ROUTE] = (dt_act_spec){5 * S + E, DT_ACT_ELEMENTWISE};
    out[XS] = (dt_act_spec){S * C, DT_ACT_ELEMENTWISE};
    out[H] = (dt_act_spec){S * F, DT_ACT_PRODUCT};
    out[G] = (dt_act_spec){S * F, DT_ACT_ELEMENTWISE};
    out[Y] = (dt_act_spec){S * C, DT_ACT_PRODUCT};
    out[D_Y] = (dt_act_spec){S * C, DT_ACT_SPLIT};
    out[D_H] = (dt_act_spec){S * F, DT_ACT_SPLIT};
    out[D_LG] = (dt_act_spec){N * E, DT_ACT_SPLIT};
    out[DYX] = (dt_act_spec){S * C, DT_ACT_SCRATCH};
    out[DG] = (dt_act_spec){S * F, DT_ACT_SCRATCH};
    out[DW] = (dt_act_spec){S, DT_ACT_SCRATCH};
    out[DLG] = (dt_act_spec){N * E, DT_ACT_SCRATCH};
    return N_ACTS;
}

/* The route buffer's arrays (ints stored in the float arena). */
typedef struct {
    int32_t *choice, *keep, *pos, *order, *count;
    float *weight;
} route;

static route route_of(const dt_gpt *m, const dt_block_call *c)
{
    const size_t S = (size_t)c->N * (size_t)m->cfg.moe.topk;
    float *r = c->a[ROUTE];
    return (route){.choice = (int32_t *)r, .weight = r + S, .keep = (int32_t *)(r + 2 * S),
                   .pos = (int32_t *)(r + 3 * S), .order = (int32_t *)(r + 4 * S),
                   .count = (int32_t *)(r + 5 * S)};
}

/* Softmax, the top K, the drops, the sort, and the rows gathered in
 * expert order; a forward's first run of the layer counts its stats. */
static void route_rows(dt_gpt *m, const dt_block_call *c, int count_stats)
{
    const dt_moe_config *mc = &m->cfg.moe;
    const int N = c->N, E = mc->experts, K = mc->topk, C = m->cfg.n_embd;
    float *probs = c->a[PROBS], *lse = probs + (size_t)N * E;
    const float *bias = m->moe.bias ? m->moe.bias + (size_t)c->layer * E : NULL;
    route r = route_of(m, c);
    dt_router_softmax(probs, lse, c->a[LOGITS], N, E);
    dt_router_topk(r.choice, r.weight, probs, bias, N, E, K);
    const long dropped = dt_router_capacity(r.keep, r.choice, c->b, c->t, K, E,
                                            mc->capacity > 0 ? dt_moe_capacity(mc, c->t) : 0);
    const int S = dt_router_sort(r.order, r.count, r.pos, r.choice, r.keep, N, E, K);
    for (int s = 0; s < S; s++)
        memcpy(c->a[XS] + (size_t)s * C, c->x + (size_t)(r.order[s] / K) * C,
               (size_t)C * sizeof(float));
    if (!count_stats || !m->moe.stats) return;
    dt_moe_layer_stats *st = &m->moe.stats[c->layer];
    dt_router_stats(probs, lse, r.choice, r.keep, c->b, c->t, E, K, &st->aux_sum, &st->z_sum,
                    st->load);
    st->seqs += c->b;
    st->tokens += N;
    st->dropped += (double)dropped;
}

/* One product per expert over its rows: out = inp @ W + b, W and b the
 * expert's tensors j and j + 1. */
static int experts_forward(dt_gpt *m, const dt_block_call *c, float *out, const float *inp,
                           int j, int IN, int OUT, const char *name)
{
    const int32_t *count = route_of(m, c).count;
    size_t row = 0;
    for (int e = 0; e < m->cfg.moe.experts; row += (size_t)count[e++]) {
        if (count[e] == 0) continue;
        if (dt_linear_forward(m->prec, out + row * OUT, inp + row * IN, W_(c, e, j),
                              W_(c, e, j + 1), count[e], IN, OUT))
            return dt_model_fail_matmul(m, name);
    }
    return 0;
}

/* res' = res + sum_k w[i,k] y[pos[i,k]] over the kept slots, k in order. */
static void combine(dt_gpt *m, const dt_block_call *c)
{
    const int C = m->cfg.n_embd, K = m->cfg.moe.topk;
    route r = route_of(m, c);
    for (int i = 0; i < c->N; i++) {
        float *o = c->a[RES] + (size_t)i * C;
        const float *res = c->res + (size_t)i * C;
        for (int j = 0; j < C; j++) o[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            const int32_t p = r.pos[i * K + k];
            if (p < 0) continue;
            const float w = r.weight[i * K + k], *y = c->a[Y] + (size_t)p * C;
            for (int j = 0; j < C; j++) o[j] += w * y[j];
        }
        for (int j = 0; j < C; j++) o[j] += res[j];
    }
}

static int forward(dt_gpt *m, const dt_block_call *c, unsigned run)
{
    const int C = m->cfg.n_embd, E = m->cfg.moe.experts, F = ffn(&m->cfg), N = c->N;
    const size_t S = (size_t)N * (size_t)m->cfg.moe.topk;
    if ((run & DT_RUN_PRODUCTS) &&
        dt_matmul(m->prec, 0, 1, N, E, C, 1.0f, c->x, C, c->w[ROUTER], C, 0.0f, c->a[LOGITS],
                  E))
        return dt_model_fail_matmul(m, "mlp.router");
    if (run & DT_RUN_ELEMENTWISE) route_rows(m, c, run == DT_RUN_ALL);
    if ((run & DT_RUN_PRODUCTS) &&
        experts_forward(m, c, c->a[H], c->a[XS], FC_W, C, F, "moe experts' c_fc"))
        return -1;
    if (run & DT_RUN_ELEMENTWISE) dt_gelu_forward(c->a[G], c->a[H], S * (size_t)F);
    if ((run & DT_RUN_PRODUCTS) &&
        experts_forward(m, c, c->a[Y], c->a[G], PROJ_W, F, C, "moe experts' c_proj"))
        return -1;
    if (run & DT_RUN_OUTPUT) combine(m, c);
    return 0;
}

/* dy[pos] = w d_out[i] for each kept slot, and dw = d_out[i] . y[pos]
 * (0 for a dropped slot). */
static void combine_backward(dt_gpt *m, const dt_block_call *c, float *dy, float *dw)
{
    const int C = m->cfg.n_embd, K = m->cfg.moe.topk;
    const float *d = m->acts.d_res;
    route r = route_of(m, c);
    for (int i = 0; i < c->N; i++)
        for (int k = 0; k < K; k++) {
            const int32_t p = r.pos[i * K + k];
            const float *di = d + (size_t)i * C;
            float s = 0.0f;
            if (p >= 0) {
                const float w = r.weight[i * K + k], *y = c->a[Y] + (size_t)p * C;
                float *o = dy + (size_t)p * C;
                for (int j = 0; j < C; j++) o[j] = w * di[j], s += di[j] * y[j];
            }
            dw[i * K + k] = s;
        }
}

/* Each expert's product backward over its rows: dinp (overwritten), and
 * in a whole backward dW and db of tensors j and j + 1. */
static int experts_backward(dt_gpt *m, const dt_block_call *c, int whole, float *dinp,
                            const float *dout, const float *inp, int j, int IN, int OUT,
                            const char *name)
{
    const int32_t *count = route_of(m, c).count;
    size_t row = 0;
    for (int e = 0; e < m->cfg.moe.experts; row += (size_t)count[e++]) {
        if (count[e] == 0) continue;
        if (dt_linear_backward(m->prec, dinp + row * IN, 0, whole ? G_(c, e, j) : NULL,
                               whole ? G_(c, e, j + 1) : NULL, dout + row * OUT,
                               inp + row * IN, W_(c, e, j), count[e], IN, OUT))
            return dt_model_fail_matmul(m, name);
    }
    return 0;
}

/* d_c[i] = sum over its kept slots of dxs[pos], k in order. */
static void scatter_back(dt_gpt *m, const dt_block_call *c, const float *dxs)
{
    const int C = m->cfg.n_embd, K = m->cfg.moe.topk;
    route r = route_of(m, c);
    for (int i = 0; i < c->N; i++) {
        float *o = m->acts.d_c + (size_t)i * C;
        for (int j = 0; j < C; j++) o[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            const int32_t p = r.pos[i * K + k];
            if (p < 0) continue;
            for (int j = 0; j < C; j++) o[j] += dxs[(size_t)p * C + j];
        }
    }
}

static int backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what)
{
    const dt_moe_config *mc = &m->cfg.moe;
    const int C = m->cfg.n_embd, E = mc->experts, K = mc->topk, F = ffn(&m->cfg), N = c->N;
    const int whole = what == DT_BWD_WHOLE;
    float *dy = whole ? c->a[DYX] : c->a[D_Y], *dh = whole ? c->a[DG] : c->a[D_H];
    float *dlg = whole ? c->a[DLG] : c->a[D_LG], *probs = c->a[PROBS];
    route r = route_of(m, c);
    const size_t S = (size_t)N * K;
    combine_backward(m, c, dy, c->a[DW]);
    if (experts_backward(m, c, whole, c->a[DG], dy, c->a[G], PROJ_W, F, C,
                         "moe experts' c_proj backward"))
        return -1;
    dt_gelu_backward(dh, c->a[H], c->a[DG], S * (size_t)F);
    if (experts_backward(m, c, whole, c->a[DYX], dh, c->a[XS], FC_W, C, F,
                         "moe experts' c_fc backward"))
        return -1;
    scatter_back(m, c, c->a[DYX]);
    const float gs = m->moe.grad_scale;
    dt_router_backward(dlg, c->a[DW], probs, probs + (size_t)N * E, r.choice, r.weight, c->b,
                       c->t, E, K, (float)(gs * c->t * mc->aux_coeff),
                       (float)(gs * mc->z_coeff));
    if (dt_matmul(m->prec, 0, 0, N, C, E, 1.0f, dlg, E, c->w[ROUTER], C, 1.0f, m->acts.d_c, C) ||
        (whole && dt_matmul(m->prec, 1, 0, E, C, N, 1.0f, dlg, E, c->x, C, 1.0f, c->g[ROUTER],
                            C)))
        return dt_model_fail_matmul(m, "moe router backward");
    return 0;
}

static int weights(dt_gpt *m, const dt_block_call *c)
{
    const dt_moe_config *mc = &m->cfg.moe;
    const int C = m->cfg.n_embd, E = mc->experts, F = ffn(&m->cfg);
    const int32_t *count = route_of(m, c).count;
    size_t row = 0;
    for (int e = 0; e < E; row += (size_t)count[e++]) {
        if (count[e] == 0) continue;
        if (dt_model_product_weights(m, G_(c, e, PROJ_W), G_(c, e, PROJ_B),
                                     c->a[D_Y] + row * C, c->a[G] + row * F, count[e], F, C,
                                     "moe experts' c_proj") ||
            dt_model_product_weights(m, G_(c, e, FC_W), G_(c, e, FC_B), c->a[D_H] + row * F,
                                     c->a[XS] + row * C, count[e], C, F, "moe experts' c_fc"))
            return -1;
    }
    if (dt_matmul(m->prec, 1, 0, E, C, c->N, 1.0f, c->a[D_LG], E, c->x, C, 1.0f, c->g[ROUTER],
                  C))
        return dt_model_fail_matmul(m, "moe router weights");
    return 0;
}

/* 6 per weight a token meets: the router's E C and its K experts' 2 C F. */
static double flops(const dt_gpt_config *cfg, int T)
{
    (void)T;
    const double C = cfg->n_embd, E = cfg->moe.experts, K = cfg->moe.topk, F = ffn(cfg);
    return 6.0 * (E * C + K * 2.0 * C * F);
}

const dt_block_kind dt_block_moe = {
    .name = "moe",
    .role = DT_BLOCK_BRANCH,
    .tensors = tensors,
    .acts = acts,
    .forward = forward,
    .backward = backward,
    .weights = weights,
    .flops = flops,
};
