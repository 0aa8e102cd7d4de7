/* LayerNorm as a block kind (torch.nn.LayerNorm over the width, biased
 * variance, eps 1e-5): weight and bias [C], whole on every rank.
 *   forward   out [N, C] from this rank's rows of the residual stream x
 *             [R, C] (sequence parallelism gathers the rest), mean and
 *             rstd [R] kept for backward
 *   backward  d(out) in d_c [R, C] -> d(x) added into d_res, and the
 *             weights' gradients (of this rank's rows, summed over the
 *             group under sequence parallelism) */
#include "kernels/layernorm.h"
#include "model/model_internal.h"

#define LN_EPS 1e-5f

enum { OUT, MEAN, RSTD, N_ACTS };
enum { WEIGHT, BIAS };

static int tensors(const dt_gpt_config *cfg, const dt_gpt_tp *tp, const dt_gpt_ep *ep,
                   dt_tensor_spec *out)
{
    (void)ep;
    (void)tp;
    out[WEIGHT] = (dt_tensor_spec){"weight", cfg->n_embd, 0, {0}, DT_INIT_ONE, 0, 0};
    out[BIAS] = (dt_tensor_spec){"bias", cfg->n_embd, 0, {0}, DT_INIT_ZERO, 0, 0};
    return 2;
}

static int acts(const dt_gpt *m, size_t N, size_t R, dt_act_spec *out)
{
    out[OUT] = (dt_act_spec){N * (size_t)m->cfg.n_embd, DT_ACT_ELEMENTWISE};
    out[MEAN] = (dt_act_spec){R, DT_ACT_ELEMENTWISE};
    out[RSTD] = (dt_act_spec){R, DT_ACT_ELEMENTWISE};
    return N_ACTS;
}

static int forward(dt_gpt *m, const dt_block_call *c, unsigned run)
{
    if (!(run & DT_RUN_ELEMENTWISE)) return 0;
    const int C = m->cfg.n_embd;
    const size_t R = dt_model_region_rows(m, (size_t)c->N);
    float *out = c->a[OUT] + dt_model_region_first(m, (size_t)c->N) * (size_t)C;
    dt_layernorm_forward(out, c->a[MEAN], c->a[RSTD], c->x, c->w[WEIGHT], c->w[BIAS], LN_EPS,
                         (int)R, C);
    return dt_model_rows_gather(m, c->a[OUT], c->N, c->blk->name);
}

static int backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what)
{
    (void)what; /* element-wise and cheap: the input half does it all */
    const int C = m->cfg.n_embd, R = (int)dt_model_region_rows(m, (size_t)c->N);
    float *part = dt_model_region_grads_begin(m, 2 * (size_t)C);
    float *gw = part ? part : c->g[WEIGHT], *gb = part ? part + C : c->g[BIAS];
    dt_layernorm_backward(m->acts.d_res, gw, gb, m->acts.d_c, c->x, c->w[WEIGHT], c->a[MEAN],
                          c->a[RSTD], R, C);
    return part ? dt_model_region_grads_end(m, c->g, 2, 2 * (size_t)C, c->blk->name) : 0;
}

static double flops(const dt_gpt_config *cfg, int T)
{
    (void)cfg, (void)T;
    return 0; /* element-wise: MFU counts products only */
}

const dt_block_kind dt_block_layernorm = {
    .name = "layernorm",
    .role = DT_BLOCK_NORM,
    .tensors = tensors,
    .acts = acts,
    .forward = forward,
    .backward = backward,
    .flops = flops,
};
