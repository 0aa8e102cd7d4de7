/* SwiGLU's element-wise part, as the Llama family's MLP:
 *   h = silu(gate) * up, silu(a) = a / (1 + exp(-a)).
 *   gate, up, h [n] (any shape, element by element). */
#ifndef DT_KERNELS_SWIGLU_H
#define DT_KERNELS_SWIGLU_H

#include <stddef.h>

void dt_swiglu_forward(float *h, const float *gate, const float *up, size_t n);
/* dgate, dup (overwritten) from dh; either may alias dh. */
void dt_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                        const float *up, size_t n);

#endif
