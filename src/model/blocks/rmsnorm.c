/* RMSNorm as a block kind (the Llama family's norms): weight [C], whole on
 * every rank, eps the configuration's (dt_gpt_norm_eps).
 *   forward   out [N, C] from this rank's rows of the residual stream x
 *             [R, C] (sequence parallelism gathers the rest), rstd [R]
 *             kept for backward
 *   backward  d(out) in d_c [R, C] -> d(x) added into d_res, and the
 *             weight's gradient (of this rank's rows, summed over the
 *             group under sequence parallelism) */
#include "kernels/rmsnorm.h"
#include "model/model_internal.h"

enum { OUT, RSTD, N_ACTS };
enum { WEIGHT };

static int tensors(const dt_gpt_config *cfg, const dt_gpt_tp *tp, const dt_gpt_ep *ep,
                   dt_tensor_spec *out)
{
    (void)ep, (void)tp;
    out[WEIGHT] = (dt_tensor_spec){"weight", cfg->n_embd, 0, {0}, DT_INIT_ONE, 0, 0};
    return 1;
}

static int acts(const dt_gpt *m, size_t N, size_t R, dt_act_spec *out)
{
    out[OUT] = (dt_act_spec){N * (size_t)m->cfg.n_embd, DT_ACT_ELEMENTWISE};
    out[RSTD] = (dt_act_spec){R, DT_ACT_ELEMENTWISE};
    return N_ACTS;
}

static int forward(dt_gpt *m, const dt_block_call *c, unsigned run)
{
    if (!(run & DT_RUN_ELEMENTWISE)) return 0;
    const int C = m->cfg.n_embd;
    const size_t R = dt_model_region_rows(m, (size_t)c->N);
    float *out = c->a[OUT] + dt_model_region_first(m, (size_t)c->N) * (size_t)C;
    dt_rmsnorm_forward(out, c->a[RSTD], c->x, c->w[WEIGHT], (float)dt_gpt_norm_eps(&m->cfg),
                       (int)R, C);
    return dt_model_rows_gather(m, c->a[OUT], c->N, c->blk->name);
}

static int backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what)
{
    (void)what; /* element-wise and cheap: the input half does it all */
    const int C = m->cfg.n_embd, R = (int)dt_model_region_rows(m, (size_t)c->N);
    float *part = dt_model_region_grads_begin(m, (size_t)C);
    dt_rmsnorm_backward(m->acts.d_res, part ? part : c->g[WEIGHT], m->acts.d_c, c->x,
                        c->w[WEIGHT], c->a[RSTD], R, C);
    return part ? dt_model_region_grads_end(m, c->g, 1, (size_t)C, c->blk->name) : 0;
}

static double flops(const dt_gpt_config *cfg, int T)
{
    (void)cfg, (void)T;
    return 0; /* element-wise: MFU counts products only */
}

const dt_block_kind dt_block_rmsnorm = {
    .name = "rmsnorm",
    .role = DT_BLOCK_NORM,
    .tensors = tensors,
    .acts = acts,
    .forward = forward,
    .backward = backward,
    .flops = flops,
};
