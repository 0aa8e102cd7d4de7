/* GELU, tanh approximation (torch.nn.functional.gelu(x, approximate="tanh")). */
#ifndef DT_KERNELS_GELU_H
#define DT_KERNELS_GELU_H

#include <stddef.h>

void dt_gelu_forward(float *out, const float *x, size_t n);
/* dx = dout * gelu'(x) (overwrites; dx may alias dout). */
void dt_gelu_backward(float *dx, const float *x, const float *dout, size_t n);

#endif
