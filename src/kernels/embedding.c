/*
 * Token plus position embedding.
 *   tokens [B, T]; wte [V, C]; wpe [maxT, C]; out, dout [B, T, C]
 * Backward scatters rows of dout into dwte by token, and sums them over the
 * batch into dwpe. To stay deterministic without atomics, each thread owns a
 * slice of the C columns and walks all positions in order: no two threads
 * touch the same element, and every element is summed in the same order
 * whatever the thread count.
 */
#include "kernels/embedding.h"

#include <stddef.h>

#include "kernels/threads.h"

void dt_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                          int B, int T, int C)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int bt = 0; bt < B * T; bt++) {
        const float *tok_row = wte + (size_t)tokens[bt] * C;
        const float *pos_row = wpe + (size_t)(bt % T) * C;
        float *o = out + (size_t)bt * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = tok_row[c] + pos_row[c];
    }
}

#define COLUMN_SLICE 64 /* a whole number of cache lines per thread */

void dt_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int B, int T, int C)
{
    int slices = (C + COLUMN_SLICE - 1) / COLUMN_SLICE;
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int s = 0; s < slices; s++) {
        int c0 = s * COLUMN_SLICE, width = C - c0 < COLUMN_SLICE ? C - c0 : COLUMN_SLICE;
        for (int bt = 0; bt < B * T; bt++) {
            const float *d = dout + (size_t)bt * C + c0;
            float *tok_row = dwte + (size_t)tokens[bt] * C + c0;
            float *pos_row = dwpe + (size_t)(bt % T) * C + c0;
#pragma omp simd
            for (int c = 0; c < width; c++) {
                tok_row[c] += d[c];
                pos_row[c] += d[c];
            }
        }
    }
}
