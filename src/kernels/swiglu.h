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
/* The same on rows whose gate and up lie side by side, as one product
 * over both weights writes them: gate row i at gu + i ld, up at gate + F,
 * h [rows, F]. Backward writes dgate and dup into dgu at the same places
 * (dgu may be gu's buffer's copy, never dh). */
void dt_swiglu_forward_rows(float *h, const float *gu, int rows, int F, int ld);
void dt_swiglu_backward_rows(float *dgu, const float *dh, const float *gu, int rows, int F,
                             int ld);

#endif
