/*
 * Rotary position embeddings, rotate-half.
 *   x [rows, ld] (heads x D columns turned), pos [rows]
 * Row by row over the kernel threads; each row's angles computed once for
 * all its heads. Backward turns by the negative angle: the rotation is
 * orthogonal, so its transpose is its inverse.
 */
#include "kernels/rope.h"

#include <math.h>
#include <stddef.h>

#include "kernels/threads.h"

enum { MAX_HALF = 1024 }; /* heads up to 2048 dimensions */

void dt_rope(float *x, int ld, const int32_t *pos, int rows, int heads, int D, double theta,
             int sign)
{
    const int half = D / 2;
    float inv[MAX_HALF];
    for (int i = 0; i < half && i < MAX_HALF; i++)
        inv[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)D);
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < rows; r++) {
        float c[MAX_HALF], s[MAX_HALF];
        for (int i = 0; i < half; i++) {
            const float angle = (float)pos[r] * inv[i];
            c[i] = cosf(angle);
            s[i] = sign > 0 ? sinf(angle) : -sinf(angle);
        }
        for (int h = 0; h < heads; h++) {
            float *a = x + (size_t)r * ld + (size_t)h * D, *b = a + half;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                const float x1 = a[i], x2 = b[i];
                a[i] = x1 * c[i] - x2 * s[i];
                b[i] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}
