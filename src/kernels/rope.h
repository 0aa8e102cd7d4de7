/* Rotary position embeddings, Hugging Face's rotate-half convention (the
 * Llama family's): in each head of D dimensions, dimension i < D / 2
 * turns with dimension i + D / 2 by the angle p theta^(-2i / D), p the
 * row's position in its sequence:
 *   out[i]       = x[i] cos - x[i + D/2] sin
 *   out[i + D/2] = x[i + D/2] cos + x[i] sin
 *   x [b, t, ld]: b sequences of t rows, each row's first heads x D
 *   columns turned in place; pos [t]: the rows' positions, the same in
 *   every sequence.
 * The angles' cosines and sines are taken in fp32 as torch takes them
 * (inverse frequencies 1 / theta^(2i / D), then p x freq). */
#ifndef DT_KERNELS_ROPE_H
#define DT_KERNELS_ROPE_H

#include <stdint.h>

/* sign +1: forward; -1: the inverse turn (backward: the gradient of the
 * turned values turned back). */
void dt_rope(float *x, int ld, const int32_t *pos, int b, int t, int heads, int D,
             double theta, int sign);

#endif
