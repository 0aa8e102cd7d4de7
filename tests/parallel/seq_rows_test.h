/* What the context-parallel attention tests share: a rank's positions of
 * a sequence sharded by dt_seq_shard, and its rows of a whole-sequence
 * reference (kernels/kernel_test.h's helpers first). */
#ifndef DT_TESTS_SEQ_ROWS_TEST_H
#define DT_TESTS_SEQ_ROWS_TEST_H

#include "kernels/attention_ring.h"
#include "kernels/kernel_test.h"

static inline const char *kind_name(dt_shard_kind k)
{
    return k == DT_SHARD_ZIGZAG ? "zigzag" : "contiguous";
}

/* Position of row i of a rank holding `rows`. */
static inline int position(const dt_seq_rows *rows, int i)
{
    for (int c = 0; c < rows->count; c++) {
        if (i < rows->len[c]) return rows->begin[c] + i;
        i -= rows->len[c];
    }
    return -1;
}

/* The rank's rows [B, Tl, w] of full [B, T, w], in double. */
static inline double *take_rows(const float *full, size_t w, int B, int T, int Tl,
                                const dt_seq_rows *mine)
{
    double *y = dalloc((size_t)B * Tl * w);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tl; i++) {
            const float *f = full + ((size_t)b * T + position(mine, i)) * w;
            double *d = y + ((size_t)b * Tl + i) * w;
            for (size_t j = 0; j < w; j++) d[j] = f[j];
        }
    return y;
}

static inline float *narrow(const double *x, size_t n)
{
    float *y = malloc((n ? n : 1) * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

#endif
