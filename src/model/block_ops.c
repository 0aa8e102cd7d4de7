/* What the block kinds share: tensor parallelism's sums around the
 * products (Megatron's f and g, and sequence parallelism's gathers and
 * reduce-scatters between them), a norm's weight gradients under sequence
 * parallelism, the two halves of a product's backward, and the attention
 * core with or without context parallelism. See
 * model_internal.h. */
#include <string.h>

#include "core/str.h"
#include "kernels/attention.h"
#include "kernels/linear.h"
#include "model/model_internal.h"

int dt_model_fail_matmul(dt_gpt *m, const char *where)
{
    dt_strf(m->error, sizeof m->error, "model: %s: %s", where, dt_matmul_error());
    return -1;
}

void dt_model_add_into(float *dst, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

int dt_model_tp_reduce(dt_gpt *m, void *buf, size_t n, dt_tp_op op, const char *where)
{
    char why[200];
    if (m->tp.size == 1) return 0;
    if (!m->tp.reduce)
        return dt_strf(m->error, sizeof m->error, "model: %s: tensor parallelism without a "
                       "group to reduce over", where), -1;
    if (m->tp.reduce(m->tp.ctx, buf, n, op, why, sizeof why) == 0) return 0;
    return dt_strf(m->error, sizeof m->error, "model: %s: %s", where, why), -1;
}

size_t dt_model_region_rows(const dt_gpt *m, size_t N)
{
    return m->tp.sp ? N / (size_t)m->tp.size : N;
}

size_t dt_model_region_first(const dt_gpt *m, size_t N)
{
    return m->tp.sp ? (size_t)m->tp.rank * dt_model_region_rows(m, N) : 0;
}

int dt_model_rows_gather(dt_gpt *m, float *out, int N, const char *name)
{
    if (!m->tp.sp) return 0;
    return dt_model_tp_reduce(m, out, (size_t)N * m->cfg.n_embd, DT_TP_GATHER_F32, name);
}

const float *dt_model_rows_gathered(dt_gpt *m, const float *d, int N, const char *name)
{
    if (!m->tp.sp) return d;
    const size_t C = (size_t)m->cfg.n_embd, r0 = dt_model_region_first(m, (size_t)N);
    float *full = m->acts.sp_full;
    memcpy(full + r0 * C, d, dt_model_region_rows(m, (size_t)N) * C * sizeof(float));
    return dt_model_tp_reduce(m, full, (size_t)N * C, DT_TP_GATHER_F32, name) ? NULL : full;
}

int dt_model_input_grad_sum(dt_gpt *m, int N, const char *name)
{
    return dt_model_tp_reduce(m, m->acts.d_c, (size_t)N * m->cfg.n_embd,
                              m->tp.sp ? DT_TP_SCATTER_SUM_F32 : DT_TP_SUM_F32, name);
}

float *dt_model_region_grads_begin(dt_gpt *m, size_t n)
{
    if (!m->tp.sp) return NULL;
    memset(m->acts.sp_ln, 0, n * sizeof(float));
    return m->acts.sp_ln;
}

int dt_model_region_grads_end(dt_gpt *m, float *const *g, int k, size_t n, const char *name)
{
    const float *part = m->acts.sp_ln;
    const size_t each = n / (size_t)k;
    if (dt_model_tp_reduce(m, m->acts.sp_ln, n, DT_TP_SUM_F32, name)) return -1;
    for (int i = 0; i < k; i++)
        for (size_t j = 0; j < each; j++) g[i][j] += part[(size_t)i * each + j];
    return 0;
}

int dt_model_product_backward(dt_gpt *m, dt_bwd_part what, dt_wlayout lay, float *dinp,
                              int dinp_accumulate, float *dW, float *db, const float *dout,
                              float *keep, const float *inp, const float *W, int N, int IN,
                              int OUT, const char *name)
{
    const int whole = what == DT_BWD_WHOLE;
    if (!whole) memcpy(keep, dout, (size_t)N * OUT * sizeof(float));
    if (dt_linear_backward_l(m->prec, lay, dinp, dinp_accumulate, whole ? dW : NULL,
                             whole ? db : NULL, dout, inp, W, N, IN, OUT))
        return dt_model_fail_matmul(m, name);
    return 0;
}

/* The product is row-parallel: unsplit, one product; split, this rank's
 * partial product summed over the group (reduce-scattered to its rows with
 * sequence parallelism). Either way the bias comes after the product, with
 * the residual, in one pass (sgemm would copy the bias into its output
 * first: one more pass over it). */
int dt_model_branch_out(dt_gpt *m, const dt_block_call *c, const float *inp, const float *W,
                        const float *bias, int IN, const char *name)
{
    const int C = m->cfg.n_embd, split = m->tp.size > 1;
    float *out = c->a[0];
    float *sum = m->tp.sp ? m->acts.d_c : out; /* [N, C]: not in use while a layer runs forward */
    if (dt_linear_forward_l(m->prec, c->blk->kind->wlayout, sum, inp, W, NULL, c->N, IN, C))
        return dt_model_fail_matmul(m, name);
    if (split && dt_model_tp_reduce(m, sum, (size_t)c->N * C,
                                    m->tp.sp ? DT_TP_SCATTER_SUM_F32 : DT_TP_SUM_F32, name))
        return -1;
    dt_linear_bias_residual(out, sum, bias, c->res, dt_model_region_rows(m, (size_t)c->N),
                            (size_t)C);
    return 0;
}

int dt_model_branch_out_backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what,
                                 float *dinp, float *dW, float *db, float *keep,
                                 const float *inp, const float *W, int IN, const char *name)
{
    const float *d_out = dt_model_rows_gathered(m, m->acts.d_res, c->N, name);
    if (!d_out) return -1;
    return dt_model_product_backward(m, what, c->blk->kind->wlayout, dinp, 0, dW, db, d_out,
                                     keep, inp, W, c->N, IN, m->cfg.n_embd, name);
}

int dt_model_branch_in_backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what, float *dW,
                                float *db, const float *dout, float *keep, const float *W,
                                int OUT, const char *name)
{
    if (dt_model_product_backward(m, what, c->blk->kind->wlayout, m->acts.d_c, 0, dW, db, dout,
                                  keep, c->x, W, c->N, m->cfg.n_embd, OUT, name))
        return -1;
    return dt_model_input_grad_sum(m, c->N, name);
}

int dt_model_product_weights(dt_gpt *m, const dt_block_call *c, float *dW, float *db,
                             const float *dout, const float *inp, int N, int IN, int OUT,
                             const char *name)
{
    if (dt_linear_backward_l(m->prec, c->blk->kind->wlayout, NULL, 0, dW, db, dout, inp, NULL, N,
                             IN, OUT))
        return dt_model_fail_matmul(m, name);
    return 0;
}

dt_linear_group dt_model_group(const dt_block_call *c, int first, int n, const int *out)
{
    dt_linear_group g = {.n = n};
    for (int i = 0; i < n; i++) {
        g.out[i] = out[i];
        g.W[i] = c->w[first + i];
        g.dW[i] = c->g[first + i];
    }
    return g;
}

int dt_model_group_forward(dt_gpt *m, const dt_block_call *c, const dt_linear_group *g,
                           float *out, const char *name)
{
    if (dt_linear_group_forward(m->prec, out, c->x, g, c->N, m->cfg.n_embd))
        return dt_model_fail_matmul(m, name);
    return 0;
}

int dt_model_group_backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what,
                            const dt_linear_group *g, const float *dout, float *keep,
                            const char *name)
{
    dt_linear_group input_only = *g;
    if (what != DT_BWD_WHOLE) {
        memcpy(keep, dout, (size_t)c->N * dt_linear_group_width(g) * sizeof(float));
        input_only.dW[0] = NULL;
    }
    if (dt_linear_group_backward(m->prec, m->acts.d_c, 0, &input_only, dout, c->x, c->N,
                                 m->cfg.n_embd))
        return dt_model_fail_matmul(m, name);
    return dt_model_input_grad_sum(m, c->N, name);
}

int dt_model_group_weights(dt_gpt *m, const dt_block_call *c, const dt_linear_group *g,
                           const float *dout, const char *name)
{
    if (dt_linear_group_backward(m->prec, NULL, 0, g, dout, c->x, c->N, m->cfg.n_embd))
        return dt_model_fail_matmul(m, name);
    return 0;
}

int dt_model_attend(dt_gpt *m, const dt_block_call *c, float *att, float *lse, const float *qkv)
{
    const int A = m->tp.attn, NH = m->tp.heads;
    if (m->cp.size == 1) {
        dt_attention_forward(att, lse, qkv, c->b, c->t, A, NH);
        return 0;
    }
    return m->cp.forward(m->cp.ctx, att, lse, qkv, c->b, c->t * m->cp.size, A, NH, m->error,
                         sizeof m->error);
}

int dt_model_attend_backward(dt_gpt *m, const dt_block_call *c, float *dqkv, const float *qkv,
                             const float *att, const float *lse)
{
    const int A = m->tp.attn, NH = m->tp.heads;
    if (m->cp.size == 1) {
        dt_attention_backward(dqkv, m->acts.d_c, qkv, att, lse, c->b, c->t, A, NH);
        return 0;
    }
    return m->cp.backward(m->cp.ctx, dqkv, m->acts.d_c, qkv, att, lse, c->b, c->t * m->cp.size,
                          A, NH, m->error, sizeof m->error);
}
