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
#include "kernels/threads.h"

/* sigmoid(a): exp(-a) is 0 in the sum's bits above 88 and +inf below -88. */
static inline float sigmoid(float a)
{
    const float m = -a < 88.0f ? (-a > -88.0f ? -a : -88.0f) : 88.0f;
    return 1.0f / (1.0f + dt_fast_expf(m));
}

void dt_swiglu_forward(float *h, const float *gate, const float *up, size_t n)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++) {
        const float a = gate[i];
        h[i] = a * sigmoid(a) * up[i];
    }
}

void dt_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                        const float *up, size_t n)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++) {
        const float a = gate[i], s = sigmoid(a), d = dh[i];
        const float silu = a * s;
        const float dg = d * up[i] * s * (1.0f + a * (1.0f - s));
        dup[i] = d * silu;
        dgate[i] = dg;
    }
}
