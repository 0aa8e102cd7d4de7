/* The row loops of the softmax cross-entropy, shared by the whole-row
 * kernel (crossentropy.c) and the one over a vocabulary slice
 * (crossentropy_split.c), so that one slice is the whole row's bits.
 *   x, e [n]: a row of logits, its exponentials. */
#ifndef DT_KERNELS_CROSSENTROPY_ROWS_H
#define DT_KERNELS_CROSSENTROPY_ROWS_H

#include <math.h>

#include "kernels/fast_exp.h"

static inline float dt_ce_row_max(const float *x, int n)
{
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

/* sum of exp(x - max), summed in double: vocabularies run to 50k entries,
 * where an fp32 running sum would lose digits. The exponentials go to e;
 * they are summed in a second pass (one loop doing both does not vectorise). */
static inline double dt_ce_sum_exp(float *e, const float *x, float max, int n)
{
#pragma omp simd
    for (int j = 0; j < n; j++) e[j] = dt_fast_expf(x[j] - max);
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) sum += e[j];
    return sum;
}

#define DT_CE_EXP_CHUNK 256

/* The same sum when there is no gradient row to hold the exponentials: in
 * chunks, whose partial sums are added in order. */
static inline double dt_ce_sum_exp_no_output(const float *x, float max, int n)
{
    float e[DT_CE_EXP_CHUNK];
    double sum = 0.0;
    for (int j0 = 0; j0 < n; j0 += DT_CE_EXP_CHUNK)
        sum += dt_ce_sum_exp(e, x + j0, max, n - j0 < DT_CE_EXP_CHUNK ? n - j0 : DT_CE_EXP_CHUNK);
    return sum;
}

#endif
