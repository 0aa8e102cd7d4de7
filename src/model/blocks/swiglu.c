/* The Llama family's MLP as a block kind: down(silu(gate(x)) * up(x)),
 * no biases, weights in torch's Linear layout [out, in]:
 * gate_proj, up_proj [F, C], down_proj [C, F], F = dt_gpt_ffn. Tensor
 * parallelism (Megatron's): gate and up column-parallel (rows [r Fl,
 * (r + 1) Fl) of each, Fl = F / tp), down row-parallel (the same columns).
 * Gate and up are one product when their tensors lie one after another
 * (dt_model_group), into gu's rows [gate | up].
 * Buffers, N rows of the micro-batch (R between the products):
 *   res [R, C]        the residual sum after it       PRODUCT
 *   gu [N, 2 Fl]      the two products' outputs       PRODUCT
 *   h [N, Fl]         silu(gate) * up                 ELEMENTWISE
 *   d_down [N, C], d_gu [N, 2 Fl]                     SPLIT: the products'
 *                     output gradients, from the input half to the weights'
 *   dh [N, Fl], dgu [N, 2 Fl]                         backward's scratch */
#include "kernels/swiglu.h"
#include "model/model_internal.h"

enum { RES, GU, H, D_DOWN, D_GU, DH, DGU, N_ACTS };
enum { GATE_W, UP_W, DOWN_W };

static int tensors(const dt_gpt_config *cfg, const dt_gpt_tp *tp, const dt_gpt_ep *ep,
                   dt_tensor_spec *out)
{
    (void)ep;
    const int C = cfg->n_embd, F = dt_gpt_ffn(cfg), split = tp && tp->size > 1;
    const int r = split ? tp->rank : 0, Fl = split ? tp->mlp : F;
    out[GATE_W] = (dt_tensor_spec){"gate_proj.weight", F, C, {0}, DT_INIT_NORMAL, 0, 0};
    out[UP_W] = (dt_tensor_spec){"up_proj.weight", F, C, {0}, DT_INIT_NORMAL, 0, 0};
    out[DOWN_W] = (dt_tensor_spec){"down_proj.weight", C, F, {0}, DT_INIT_RESIDUAL, 0, 0};
    if (split) { /* this rank's rows of gate and up, the same columns of down */
        out[GATE_W].slice = out[UP_W].slice = (dt_slice){r * Fl, Fl, 1, 0, 0, C};
        out[DOWN_W].slice = (dt_slice){0, C, 1, r * Fl, 0, Fl};
    }
    return 3;
}

static int acts(const dt_gpt *m, size_t N, size_t R, dt_act_spec *out)
{
    const size_t C = (size_t)m->cfg.n_embd, F = (size_t)m->tp.mlp;
    out[RES] = (dt_act_spec){R * C, DT_ACT_PRODUCT};
    out[GU] = (dt_act_spec){N * 2 * F, DT_ACT_PRODUCT};
    out[H] = (dt_act_spec){N * F, DT_ACT_ELEMENTWISE};
    out[D_DOWN] = (dt_act_spec){N * C, DT_ACT_SPLIT};
    out[D_GU] = (dt_act_spec){N * 2 * F, DT_ACT_SPLIT};
    out[DH] = (dt_act_spec){N * F, DT_ACT_SCRATCH};
    out[DGU] = (dt_act_spec){N * 2 * F, DT_ACT_SCRATCH};
    return N_ACTS;
}

static dt_linear_group gate_up(const dt_gpt *m, const dt_block_call *c)
{
    const int out[2] = {m->tp.mlp, m->tp.mlp};
    return dt_model_group(c, GATE_W, 2, out);
}

static int forward(dt_gpt *m, const dt_block_call *c, unsigned run)
{
    const int F = m->tp.mlp, N = c->N;
    const dt_linear_group g = gate_up(m, c);
    if ((run & DT_RUN_PRODUCTS) &&
        dt_model_group_forward(m, c, &g, c->a[GU], "mlp.gate_proj/up_proj"))
        return -1;
    if (run & DT_RUN_ELEMENTWISE) dt_swiglu_forward_rows(c->a[H], c->a[GU], N, F, 2 * F);
    if (!(run & DT_RUN_OUTPUT)) return 0;
    return dt_model_branch_out(m, c, c->a[H], c->w[DOWN_W], NULL, F, "mlp.down_proj");
}

static int backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what)
{
    const int F = m->tp.mlp, N = c->N;
    const dt_linear_group g = gate_up(m, c);
    if (dt_model_branch_out_backward(m, c, what, c->a[DH], c->g[DOWN_W], NULL, c->a[D_DOWN],
                                     c->a[H], c->w[DOWN_W], F, "mlp.down_proj backward"))
        return -1;
    dt_swiglu_backward_rows(c->a[DGU], c->a[DH], c->a[GU], N, F, 2 * F);
    return dt_model_group_backward(m, c, what, &g, c->a[DGU], c->a[D_GU],
                                   "mlp.gate_proj/up_proj backward");
}

static int weights(dt_gpt *m, const dt_block_call *c)
{
    const int C = m->cfg.n_embd, F = m->tp.mlp, N = c->N;
    const dt_linear_group g = gate_up(m, c);
    if (dt_model_product_weights(m, c, c->g[DOWN_W], NULL, c->a[D_DOWN], c->a[H], N, F, C,
                                 "mlp.down_proj"))
        return -1;
    return dt_model_group_weights(m, c, &g, c->a[D_GU], "mlp.gate_proj/up_proj");
}

/* 6 per weight of its three products, 3 C F. */
static double flops(const dt_gpt_config *cfg, int T)
{
    (void)T;
    return 6.0 * 3.0 * cfg->n_embd * (double)dt_gpt_ffn(cfg);
}

const dt_block_kind dt_block_swiglu = {
    .name = "swiglu",
    .role = DT_BLOCK_BRANCH,
    .tensors = tensors,
    .acts = acts,
    .forward = forward,
    .backward = backward,
    .weights = weights,
    .flops = flops,
    .wlayout = DT_LINEAR,
};
