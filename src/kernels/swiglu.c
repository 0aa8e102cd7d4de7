/*
 * SwiGLU's element-wise part.
 *   gate, up, h, dh, dgate, dup [n]
 * d silu(a) / da = s (1 + a (1 - s)), s = sigmoid(a). Element by element
 * over the kernel threads: the bits do not depend on the thread count.
 */
#include "kernels/swiglu.h"

#include <math.h>

#include "kernels/threads.h"

void dt_swiglu_forward(float *h, const float *gate, const float *up, size_t n)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++) {
        const float a = gate[i];
        h[i] = a / (1.0f + expf(-a)) * up[i];
    }
}

void dt_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                        const float *up, size_t n)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++) {
        const float a = gate[i], s = 1.0f / (1.0f + expf(-a)), d = dh[i];
        const float silu = a * s;
        const float dg = d * up[i] * s * (1.0f + a * (1.0f - s));
        dup[i] = d * silu;
        dgate[i] = dg;
    }
}
