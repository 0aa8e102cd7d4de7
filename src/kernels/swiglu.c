/*
 * SwiGLU's element-wise part.
 *   gate, up, h, dh, dgate, dup [n]
 * d silu(a) / da = s (1 + a (1 - s)), s = sigmoid(a). Element by element
 * over the kernel threads: the bits do not depend on the thread count.
 * The exponential is fast_exp.h's (it vectorizes; libm's expf does not),
 * its argument clamped where the sigmoid is 0 or 1 in fp32 anyway.
 */
#include "kernels/swiglu.h"

#include "kernels/fast_exp.h"
#include "kernels/profile.h"
#include "kernels/threads.h"

/* sigmoid(a): exp(-a) is 0 in the sum's bits above 88 and +inf below -88. */
static inline float sigmoid(float a)
{
    const float m = -a < 88.0f ? (-a > -88.0f ? -a : -88.0f) : 88.0f;
    return 1.0f / (1.0f + dt_fast_expf(m));
}

static void swiglu_forward_body(float *h, const float *gate, const float *up, size_t n)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++) {
        const float a = gate[i];
        h[i] = a * sigmoid(a) * up[i];
    }
}

void dt_swiglu_forward(float *h, const float *gate, const float *up, size_t n)
{
    const uint64_t t0 = dt_prof_begin();
    swiglu_forward_body(h, gate, up, n);
    dt_prof_end(DT_PROF_ACTIVATION, t0, 8.0 * (double)n, 12.0 * (double)n);
}

/* dL/dgate, given s = sigmoid(a), the output's gradient d and up u. */
static inline float dgate_of(float a, float s, float d, float u)
{
    return d * u * s * (1.0f + a * (1.0f - s));
}

static void swiglu_backward_body(float *dgate, float *dup, const float *dh, const float *gate,
                                 const float *up, size_t n)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++) {
        const float a = gate[i], s = sigmoid(a), d = dh[i];
        const float silu = a * s;
        const float dg = dgate_of(a, s, d, up[i]);
        dup[i] = d * silu;
        dgate[i] = dg;
    }
}

void dt_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                        const float *up, size_t n)
{
    const uint64_t t0 = dt_prof_begin();
    swiglu_backward_body(dgate, dup, dh, gate, up, n);
    dt_prof_end(DT_PROF_ACTIVATION, t0, 16.0 * (double)n, 20.0 * (double)n);
}

static void swiglu_forward_rows_body(float *h, const float *gu, int rows, int F, int ld)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < rows; r++) {
        const float *g = gu + (size_t)r * ld, *u = g + F;
        float *o = h + (size_t)r * F;
#pragma omp simd
        for (int i = 0; i < F; i++) o[i] = g[i] * sigmoid(g[i]) * u[i];
    }
}

void dt_swiglu_forward_rows(float *h, const float *gu, int rows, int F, int ld)
{
    const uint64_t t0 = dt_prof_begin();
    swiglu_forward_rows_body(h, gu, rows, F, ld);
    dt_prof_end(DT_PROF_ACTIVATION, t0, 8.0 * rows * F, 12.0 * rows * F);
}

static void swiglu_backward_rows_body(float *dgu, const float *dh, const float *gu, int rows, int F,
                                      int ld)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < rows; r++) {
        const float *g = gu + (size_t)r * ld, *u = g + F, *d = dh + (size_t)r * F;
        float *dg = dgu + (size_t)r * ld, *du = dg + F;
#pragma omp simd
        for (int i = 0; i < F; i++) {
            const float a = g[i], s = sigmoid(a);
            du[i] = d[i] * (a * s);
            dg[i] = dgate_of(a, s, d[i], u[i]);
        }
    }
}

void dt_swiglu_backward_rows(float *dgu, const float *dh, const float *gu, int rows, int F,
                             int ld)
{
    const uint64_t t0 = dt_prof_begin();
    swiglu_backward_rows_body(dgu, dh, gu, rows, F, ld);
    dt_prof_end(DT_PROF_ACTIVATION, t0, 16.0 * rows * F, 20.0 * rows * F);
}
