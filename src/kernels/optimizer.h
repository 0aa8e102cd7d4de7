/* Optimizer updates on a contiguous range of parameters, as PyTorch defines
 * them. grad_scale multiplies each gradient first (the clipping coefficient,
 * or 1). t is the step number, from 1, for bias correction. */
#ifndef DT_KERNELS_OPTIMIZER_H
#define DT_KERNELS_OPTIMIZER_H

#include <stddef.h>

/* torch.optim.AdamW: p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). */
void dt_adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                     float beta1, float beta2, float eps, float wd, int t, float grad_scale);
/* torch.optim.Adam: weight decay is L2, added to the gradient (g += wd p). */
void dt_adam_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                    float beta1, float beta2, float eps, float wd, int t, float grad_scale);
/* torch.optim.SGD with momentum mu (buf may be NULL when mu == 0) and L2 wd:
 * g += wd p; buf = t == 1 ? g : mu buf + g; p -= lr buf. */
void dt_sgd_update(float *p, const float *g, float *buf, size_t n, float lr, float momentum,
                   float wd, int t, float grad_scale);
/* Sum of squares of g, accumulated in double (for the global gradient norm). */
double dt_sum_squares(const float *g, size_t n);
/* The sum of squares of each block of `block` floats of g[0, n) (the last
 * may be shorter) into out[0 .. ceil(n / block)). Each block is summed in
 * one fixed order (eight lanes by position, then paired), whatever the
 * thread count or the buffer's address: a norm added up from blocks is
 * the same bits however the blocks are spread over buffers and ranks. */
void dt_sum_squares_blocks(const float *g, size_t n, size_t block, double *out);

#endif
