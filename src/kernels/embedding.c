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

#include <limits.h>
#include <stddef.h>

#include "kernels/profile.h"
#include "kernels/threads.h"

#define COLUMN_SLICE 64 /* a whole number of cache lines per thread */

/* a token counts on this rank only when it lies in [v0, v0 + Vl) */
static int in_range(int32_t token, int v0, int Vl) { return token >= v0 && token - v0 < Vl; }

static void embedding_forward_range_body(float *out, const int32_t *tokens, const float *wte_slice,
                                         const float *wpe, int B, int T, int C, int v0, int Vl)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * C;
        if (!in_range(tokens[bt], v0, Vl)) {
            for (int c = 0; c < C; c++) o[c] = 0.0f;
            continue;
        }
        const float *tok_row = wte_slice + (size_t)(tokens[bt] - v0) * C;
        const float *pos_row = wpe ? wpe + (size_t)(bt % T) * C : NULL;
        if (pos_row) {
#pragma omp simd
            for (int c = 0; c < C; c++) o[c] = tok_row[c] + pos_row[c];
        } else {
            for (int c = 0; c < C; c++) o[c] = tok_row[c];
        }
    }
}

void dt_embedding_forward_range(float *out, const int32_t *tokens, const float *wte_slice,
                                const float *wpe, int B, int T, int C, int v0, int Vl)
{
    const uint64_t t0 = dt_prof_begin();
    embedding_forward_range_body(out, tokens, wte_slice, wpe, B, T, C, v0, Vl);
    dt_prof_end(DT_PROF_EMBEDDING, t0, (double)B * T * C, 4.0 * 3.0 * B * T * C);
}

/* Column slices per thread as in dt_embedding_backward: every element of
 * dwte_slice and dwpe sees the rows in the same order, so the slice's rows
 * get the unsplit backward's bits. */
static void embedding_backward_range_body(float *dwte_slice, float *dwpe, const float *dout,
                                          const int32_t *tokens, int B, int T, int C, int v0,
                                          int Vl)
{
    int slices = (C + COLUMN_SLICE - 1) / COLUMN_SLICE;
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int s = 0; s < slices; s++) {
        int c0 = s * COLUMN_SLICE, width = C - c0 < COLUMN_SLICE ? C - c0 : COLUMN_SLICE;
        for (int bt = 0; bt < B * T; bt++) {
            const float *d = dout + (size_t)bt * C + c0;
            if (in_range(tokens[bt], v0, Vl)) {
                float *tok_row = dwte_slice + (size_t)(tokens[bt] - v0) * C + c0;
#pragma omp simd
                for (int c = 0; c < width; c++) tok_row[c] += d[c];
            }
            if (dwpe) {
                float *pos_row = dwpe + (size_t)(bt % T) * C + c0;
#pragma omp simd
                for (int c = 0; c < width; c++) pos_row[c] += d[c];
            }
        }
    }
}

void dt_embedding_backward_range(float *dwte_slice, float *dwpe, const float *dout,
                                 const int32_t *tokens, int B, int T, int C, int v0, int Vl)
{
    const uint64_t t0 = dt_prof_begin();
    embedding_backward_range_body(dwte_slice, dwpe, dout, tokens, B, T, C, v0, Vl);
    dt_prof_end(DT_PROF_EMBEDDING, t0, 2.0 * B * T * C, 4.0 * 5.0 * B * T * C);
}

/* The whole vocabulary is the slice that holds every token. */
void dt_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                          int B, int T, int C)
{
    dt_embedding_forward_range(out, tokens, wte, wpe, B, T, C, 0, INT_MAX);
}

void dt_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int B, int T, int C)
{
    dt_embedding_backward_range(dwte, dwpe, dout, tokens, B, T, C, 0, INT_MAX);
}
