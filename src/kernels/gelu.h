/* GELU, tanh approximation (torch.nn.functional.gelu(x, approximate="tanh")). */
#ifndef DT_KERNELS_GELU_H
#define DT_KERNELS_GELU_H

#include <stddef.h>

void dt_gelu_forward(float *out, const float *x, size_t n);
/* dx = dout * gelu'(x) (overwrites; dx may alias dout). */
void dt_gelu_backward(float *dx, const float *x, const float *dout, size_t n);

/* The same on a product's output that still lacks its bias: x [rows, cols],
 * bias [cols] (NULL: none), out = gelu(x + bias) and dx = dout * gelu'(x +
 * bias) (dx may alias dout). x + bias is rounded once, as the product with
 * its bias would have rounded it. */
void dt_gelu_bias_forward(float *out, const float *x, const float *bias, size_t rows,
                          size_t cols);
void dt_gelu_bias_backward(float *dx, const float *x, const float *bias, const float *dout,
                           size_t rows, size_t cols);

#endif
