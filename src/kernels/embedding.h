/* Token plus position embedding.
 *   tokens [B, T], wte [V, C], wpe [maxT, C], out [B, T, C]. */
#ifndef DT_KERNELS_EMBEDDING_H
#define DT_KERNELS_EMBEDDING_H

#include <stdint.h>

void dt_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                          int B, int T, int C);
/* dwte[tokens[b,t]] += dout[b,t], dwpe[t] += dout[b,t]. */
void dt_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int B, int T, int C);

#endif
