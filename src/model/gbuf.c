/* Gradient buffers of either precision. See gbuf.h. */
#include "model/gbuf.h"

#include <string.h>

#include "kernels/cast.h"

const float *dt_gbuf_view(dt_gbuf g, size_t n, float *scratch)
{
    if (g.f32) return g.f32;
    dt_cast_bf16_to_f32(scratch, g.bf16, n);
    return scratch;
}

void dt_gbuf_accumulate(dt_gbuf g, const float *src, size_t n, int first)
{
    if (g.f32) {
        if (first) {
            memcpy(g.f32, src, n * sizeof(float));
        } else {
            for (size_t i = 0; i < n; i++) g.f32[i] += src[i];
        }
        return;
    }
    if (first) {
        dt_cast_f32_to_bf16(g.bf16, src, n);
        return;
    }
    float sum[DT_GBUF_CHUNK];
    for (size_t k = 0; k < n; k += DT_GBUF_CHUNK) {
        size_t c = n - k < DT_GBUF_CHUNK ? n - k : DT_GBUF_CHUNK;
        dt_cast_bf16_to_f32(sum, g.bf16 + k, c);
        for (size_t i = 0; i < c; i++) sum[i] += src[k + i];
        dt_cast_f32_to_bf16(g.bf16 + k, sum, c);
    }
}

void dt_gbuf_zero(dt_gbuf g, size_t n) { memset(dt_gbuf_ptr(g), 0, n * dt_gbuf_esz(g)); }
