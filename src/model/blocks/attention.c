/* Causal self-attention as a block kind (GPT-2's attn): the products
 * c_attn (C -> 3C, q k v) and c_proj (C -> C) around the attention of
 * each head. Tensor parallelism (Megatron's): c_attn column-parallel (the
 * q, k and v columns of this rank's heads, A = C / tp of each), c_proj
 * row-parallel (the rows of those heads), its bias whole and added once.
 * Context parallelism runs the attention over the group's rows through
 * the hooks of dt_gpt_cp (ring attention or Ulysses).
 * Buffers, N rows of the micro-batch (R between the products):
 *   res [R, C]   the residual sum after it       PRODUCT
 *   qkv [N, 3A]  c_attn's output                 PRODUCT
 *   att [N, A]   the heads' output               PRODUCT
 *   lse [S N]    what attention keeps (its log-sum-exp; cp: its `saved`)
 *   d_proj [N, C], d_qkv [N, 3A]                 SPLIT: the products'
 *                output gradients, from the input half to the weights'
 *   dqkv [N, 3A] backward's scratch */
#include "model/model_internal.h"

enum { RES, QKV, ATT, LSE, D_PROJ, D_QKV, DQKV, N_ACTS };
enum { QKV_W, QKV_B, PROJ_W, PROJ_B };

static int tensors(const dt_gpt_config *cfg, const dt_gpt_tp *tp, const dt_gpt_ep *ep,
                   dt_tensor_spec *out)
{
    (void)ep;
    const int C = cfg->n_embd, split = tp && tp->size > 1;
    const int r = split ? tp->rank : 0, A = split ? tp->attn : C;
    out[QKV_W] = (dt_tensor_spec){"c_attn.weight", C, 3 * C, {0}, DT_INIT_NORMAL, 0, 0};
    out[QKV_B] = (dt_tensor_spec){"c_attn.bias", 3 * C, 0, {0}, DT_INIT_ZERO, 0, 0};
    out[PROJ_W] = (dt_tensor_spec){"c_proj.weight", C, C, {0}, DT_INIT_RESIDUAL, 0, 0};
    out[PROJ_B] = (dt_tensor_spec){"c_proj.bias", C, 0, {0}, DT_INIT_ZERO, 0, 0};
    if (split) { /* this rank's heads: their q, k, v blocks of columns; their rows */
        out[QKV_W].slice = (dt_slice){0, C, 3, r * A, C, 3 * A};
        out[QKV_B].slice = (dt_slice){0, 1, 3, r * A, C, 3 * A};
        out[PROJ_W].slice = (dt_slice){r * A, A, 1, 0, 0, C};
    }
    return 4;
}

static int acts(const dt_gpt *m, size_t N, size_t R, dt_act_spec *out)
{
    const size_t C = (size_t)m->cfg.n_embd, A = (size_t)m->tp.attn;
    const size_t S = (size_t)m->tp.heads + (size_t)m->cp.saved_widths * A;
    out[RES] = (dt_act_spec){R * C, DT_ACT_PRODUCT};
    out[QKV] = (dt_act_spec){N * 3 * A, DT_ACT_PRODUCT};
    out[ATT] = (dt_act_spec){N * A, DT_ACT_PRODUCT};
    out[LSE] = (dt_act_spec){S * N, DT_ACT_PRODUCT};
    out[D_PROJ] = (dt_act_spec){N * C, DT_ACT_SPLIT};
    out[D_QKV] = (dt_act_spec){N * 3 * A, DT_ACT_SPLIT};
    out[DQKV] = (dt_act_spec){N * 3 * A, DT_ACT_SCRATCH};
    return N_ACTS;
}

static int forward(dt_gpt *m, const dt_block_call *c, unsigned run)
{
    const int C = m->cfg.n_embd, A = m->tp.attn, N = c->N;
    if (run & DT_RUN_PRODUCTS) {
        if (dt_linear_forward(m->prec, c->a[QKV], c->x, c->w[QKV_W], c->w[QKV_B], N, C, 3 * A))
            return dt_model_fail_matmul(m, "attn.c_attn");
        if (dt_model_attend(m, c, c->a[ATT], c->a[LSE], c->a[QKV])) return -1;
    }
    if (!(run & DT_RUN_OUTPUT)) return 0;
    return dt_model_branch_out(m, c, c->a[ATT], c->w[PROJ_W], c->w[PROJ_B], A, "attn.c_proj");
}

static int backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what)
{
    const int A = m->tp.attn;
    if (dt_model_branch_out_backward(m, c, what, m->acts.d_c, c->g[PROJ_W], c->g[PROJ_B],
                                     c->a[D_PROJ], c->a[ATT], c->w[PROJ_W], A,
                                     "attn.c_proj backward"))
        return -1;
    if (dt_model_attend_backward(m, c, c->a[DQKV], c->a[QKV], c->a[ATT], c->a[LSE])) return -1;
    return dt_model_branch_in_backward(m, c, what, c->g[QKV_W], c->g[QKV_B], c->a[DQKV],
                                       c->a[D_QKV], c->w[QKV_W], 3 * A, "attn.c_attn backward");
}

static int weights(dt_gpt *m, const dt_block_call *c)
{
    const int C = m->cfg.n_embd, A = m->tp.attn, N = c->N;
    if (dt_model_product_weights(m, c, c->g[PROJ_W], c->g[PROJ_B], c->a[D_PROJ], c->a[ATT], N, A,
                                 C, "attn.c_proj") ||
        dt_model_product_weights(m, c, c->g[QKV_W], c->g[QKV_B], c->a[D_QKV], c->x, N, C, 3 * A,
                                 "attn.c_attn"))
        return -1;
    return 0;
}

/* 6 per weight of its products (4 C^2), and the two products of the
 * attention itself: 4 C FLOPs per query-key pair forward, 8 C backward,
 * T / 2 keys per query on average under the causal mask: 6 T C. */
static double flops(const dt_gpt_config *cfg, int T)
{
    const double C = cfg->n_embd;
    return 6.0 * 4.0 * C * C + 6.0 * (double)T * C;
}

const dt_block_kind dt_block_attention = {
    .name = "attention",
    .role = DT_BLOCK_BRANCH,
    .tensors = tensors,
    .acts = acts,
    .forward = forward,
    .backward = backward,
    .weights = weights,
    .flops = flops,
};
