/* Block-wise int8 quantization. See quant.h. */
#include "kernels/quant.h"

#include <math.h>

size_t dt_quant_blocks(size_t n, size_t block) { return (n + block - 1) / block; }

void dt_quant_int8(int8_t *q, float *scales, const float *x, size_t n, size_t block)
{
    for (size_t b = 0, lo = 0; lo < n; b++, lo += block) {
        size_t hi = lo + block < n ? lo + block : n;
        float amax = 0.0f;
        for (size_t i = lo; i < hi; i++) amax = fmaxf(amax, fabsf(x[i]));
        float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        scales[b] = scale;
        for (size_t i = lo; i < hi; i++) {
            float v = nearbyintf(x[i] * inv);
            q[i] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
    }
}

void dt_dequant_int8(float *out, const int8_t *q, const float *scales, size_t n, size_t block)
{
    for (size_t b = 0, lo = 0; lo < n; b++, lo += block) {
        size_t hi = lo + block < n ? lo + block : n;
        for (size_t i = lo; i < hi; i++) out[i] = (float)q[i] * scales[b];
    }
}
