/* LayerNorm over the last dimension, as torch.nn.LayerNorm (biased variance).
 *   x, out [N, C]; w, b [C]; mean, rstd [N] saved for backward. */
#ifndef DT_KERNELS_LAYERNORM_H
#define DT_KERNELS_LAYERNORM_H

void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, float eps, int N, int C);
/* dx += d(loss)/dx (accumulates: the residual stream sums two paths),
 * dw += ..., db += ... . */
void dt_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                           const float *w, const float *mean, const float *rstd, int N, int C);

#endif
