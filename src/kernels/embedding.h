/* Token plus position embedding.
 *   tokens [B, T], wte [V, C], wpe [maxT, C], out [B, T, C].
 * The _range forms serve a vocabulary split across ranks (tensor
 * parallelism, slices as dt_vocab_slice makes them):
 *   wte_slice, dwte_slice [Vl, C]   rows [v0, v0 + Vl) of wte, dwte
 * wpe stays whole on every rank. */
#ifndef DT_KERNELS_EMBEDDING_H
#define DT_KERNELS_EMBEDDING_H

#include <stdint.h>

void dt_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                          int B, int T, int C);
/* dwte[tokens[b,t]] += dout[b,t], dwpe[t] += dout[b,t]. */
void dt_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int B, int T, int C);

/* out[b,t] = wte_slice[tokens[b,t] - v0] + wpe[t] where the token lies in the
 * slice, zeros elsewhere; wpe NULL leaves the positions out. Every rank passes
 * wpe: the position is added on the one rank that owns the token, so a SUM
 * all-reduce over the ranks adds only zeros to that rank's fp32 addition and
 * gives dt_embedding_forward's bits. */
void dt_embedding_forward_range(float *out, const int32_t *tokens, const float *wte_slice,
                                const float *wpe, int B, int T, int C, int v0, int Vl);
/* dwte_slice[tokens[b,t] - v0] += dout[b,t] for tokens in the slice;
 * dwpe[t] += dout[b,t] for every position when dwpe is not NULL (dout is
 * whole on every rank, so each rank gets the same dwpe as the unsplit
 * backward, with no communication). */
void dt_embedding_backward_range(float *dwte_slice, float *dwpe, const float *dout,
                                 const int32_t *tokens, int B, int T, int C, int v0, int Vl);

#endif
