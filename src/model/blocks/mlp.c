/* GPT-2's MLP as a block kind: c_fc (C -> 4C), GELU (tanh approximation),
 * c_proj (4C -> C). Tensor parallelism (Megatron's): c_fc column-parallel
 * (columns [r F, (r + 1) F) of 4C, F = 4C / tp), c_proj row-parallel (the
 * same rows), its bias whole and added once.
 * Buffers, N rows of the micro-batch (R between the products):
 *   res [R, C]       the residual sum after it          PRODUCT
 *   fc [N, F]        c_fc's product, without its bias   PRODUCT
 *                    (GELU adds it in its own pass: gelu.h)
 *   gelu [N, F]      GELU's                             ELEMENTWISE
 *   d_fcp [N, C], d_fc [N, F]                           SPLIT: the products'
 *                    output gradients, from the input half to the weights'
 *   dfc [N, F]       backward's scratch */
#include "kernels/gelu.h"
#include "model/model_internal.h"

enum { RES, FC, GELU, D_FCP, D_FC, DFC, N_ACTS };
enum { FC_W, FC_B, PROJ_W, PROJ_B };

static int tensors(const dt_gpt_config *cfg, const dt_gpt_tp *tp, const dt_gpt_ep *ep,
                   dt_tensor_spec *out)
{
    (void)ep;
    const int C = cfg->n_embd, split = tp && tp->size > 1;
    const int r = split ? tp->rank : 0, F = split ? tp->mlp : 4 * C;
    out[FC_W] = (dt_tensor_spec){"c_fc.weight", C, 4 * C, {0}, DT_INIT_NORMAL, 0, 0};
    out[FC_B] = (dt_tensor_spec){"c_fc.bias", 4 * C, 0, {0}, DT_INIT_ZERO, 0, 0};
    out[PROJ_W] = (dt_tensor_spec){"c_proj.weight", 4 * C, C, {0}, DT_INIT_RESIDUAL, 0, 0};
    out[PROJ_B] = (dt_tensor_spec){"c_proj.bias", C, 0, {0}, DT_INIT_ZERO, 0, 0};
    if (split) { /* this rank's columns of c_fc, the same rows of c_proj */
        out[FC_W].slice = (dt_slice){0, C, 1, r * F, 0, F};
        out[FC_B].slice = (dt_slice){0, 1, 1, r * F, 0, F};
        out[PROJ_W].slice = (dt_slice){r * F, F, 1, 0, 0, C};
    }
    return 4;
}

static int acts(const dt_gpt *m, size_t N, size_t R, dt_act_spec *out)
{
    const size_t C = (size_t)m->cfg.n_embd, F = (size_t)m->tp.mlp;
    out[RES] = (dt_act_spec){R * C, DT_ACT_PRODUCT};
    out[FC] = (dt_act_spec){N * F, DT_ACT_PRODUCT};
    out[GELU] = (dt_act_spec){N * F, DT_ACT_ELEMENTWISE};
    out[D_FCP] = (dt_act_spec){N * C, DT_ACT_SPLIT};
    out[D_FC] = (dt_act_spec){N * F, DT_ACT_SPLIT};
    out[DFC] = (dt_act_spec){N * F, DT_ACT_SCRATCH};
    return N_ACTS;
}

static int forward(dt_gpt *m, const dt_block_call *c, unsigned run)
{
    const int C = m->cfg.n_embd, F = m->tp.mlp, N = c->N;
    if ((run & DT_RUN_PRODUCTS) &&
        dt_linear_forward(m->prec, c->a[FC], c->x, c->w[FC_W], NULL, N, C, F))
        return dt_model_fail_matmul(m, "mlp.c_fc");
    if (run & DT_RUN_ELEMENTWISE)
        dt_gelu_bias_forward(c->a[GELU], c->a[FC], c->w[FC_B], (size_t)N, (size_t)F);
    if (!(run & DT_RUN_OUTPUT)) return 0;
    return dt_model_branch_out(m, c, c->a[GELU], c->w[PROJ_W], c->w[PROJ_B], F, "mlp.c_proj");
}

static int backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what)
{
    const int F = m->tp.mlp, N = c->N;
    if (dt_model_branch_out_backward(m, c, what, c->a[DFC], c->g[PROJ_W], c->g[PROJ_B],
                                     c->a[D_FCP], c->a[GELU], c->w[PROJ_W], F,
                                     "mlp.c_proj backward"))
        return -1;
    dt_gelu_bias_backward(c->a[DFC], c->a[FC], c->w[FC_B], c->a[DFC], (size_t)N, (size_t)F);
    return dt_model_branch_in_backward(m, c, what, c->g[FC_W], c->g[FC_B], c->a[DFC],
                                       c->a[D_FC], c->w[FC_W], F, "mlp.c_fc backward");
}

static int weights(dt_gpt *m, const dt_block_call *c)
{
    const int C = m->cfg.n_embd, F = m->tp.mlp, N = c->N;
    if (dt_model_product_weights(m, c, c->g[PROJ_W], c->g[PROJ_B], c->a[D_FCP], c->a[GELU], N, F,
                                 C, "mlp.c_proj") ||
        dt_model_product_weights(m, c, c->g[FC_W], c->g[FC_B], c->a[D_FC], c->x, N, C, F,
                                 "mlp.c_fc"))
        return -1;
    return 0;
}

/* 6 per weight of its two products, 8 C^2. */
static double flops(const dt_gpt_config *cfg, int T)
{
    (void)T;
    const double C = cfg->n_embd;
    return 6.0 * 8.0 * C * C;
}

const dt_block_kind dt_block_mlp = {
    .name = "mlp",
    .role = DT_BLOCK_BRANCH,
    .tensors = tensors,
    .acts = acts,
    .forward = forward,
    .backward = backward,
    .weights = weights,
    .flops = flops,
};
