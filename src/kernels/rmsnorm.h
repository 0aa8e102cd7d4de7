/* RMSNorm over the last dimension, as the Llama family's (no mean, no
 * bias): out = x / sqrt(mean(x^2) + eps) * w.
 *   x, out [N, C]; w [C]; rstd [N] saved for backward. */
#ifndef DT_KERNELS_RMSNORM_H
#define DT_KERNELS_RMSNORM_H

void dt_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, float eps,
                        int N, int C);
/* dx += d(loss)/dx (accumulates: the residual stream sums two paths),
 * dw += ... . */
void dt_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                         const float *w, const float *rstd, int N, int C);

#endif
