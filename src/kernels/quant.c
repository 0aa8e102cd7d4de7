/* Block-wise int8 and int4 quantization. See quant.h. */
#include "kernels/quant.h"

#include <math.h>
#include <string.h>

#include "kernels/cast.h"

size_t dt_quant_blocks(size_t n, size_t block) { return (n + block - 1) / block; }

/* The scale of x[lo, hi) for integers up to qmax, and its inverse. */
static float block_scale(const float *x, size_t lo, size_t hi, float qmax, float *inv)
{
    float amax = 0.0f;
    for (size_t i = lo; i < hi; i++) amax = fmaxf(amax, fabsf(x[i]));
    *inv = amax > 0.0f ? qmax / amax : 0.0f;
    return amax / qmax;
}

static int quantize(float x, float inv, float qmax)
{
    float v = nearbyintf(x * inv);
    return (int)(v > qmax ? qmax : v < -qmax ? -qmax : v);
}

void dt_quant_int8(int8_t *q, float *scales, const float *x, size_t n, size_t block)
{
    for (size_t b = 0, lo = 0; lo < n; b++, lo += block) {
        size_t hi = lo + block < n ? lo + block : n;
        float inv;
        scales[b] = block_scale(x, lo, hi, 127.0f, &inv);
        for (size_t i = lo; i < hi; i++) q[i] = (int8_t)quantize(x[i], inv, 127.0f);
    }
}

void dt_dequant_int8(float *out, const int8_t *q, const float *scales, size_t n, size_t block)
{
    for (size_t b = 0, lo = 0; lo < n; b++, lo += block) {
        size_t hi = lo + block < n ? lo + block : n;
        for (size_t i = lo; i < hi; i++) out[i] = (float)q[i] * scales[b];
    }
}

/* int4: two values a byte, element 2k in the low nibble of byte k. */
static void quant_int4(uint8_t *q, float *scales, const float *x, size_t n, size_t block)
{
    for (size_t i = 0; i < (n + 1) / 2; i++) q[i] = 0;
    for (size_t b = 0, lo = 0; lo < n; b++, lo += block) {
        size_t hi = lo + block < n ? lo + block : n;
        float inv;
        scales[b] = block_scale(x, lo, hi, 7.0f, &inv);
        for (size_t i = lo; i < hi; i++)
            q[i / 2] |= (uint8_t)((quantize(x[i], inv, 7.0f) & 0xF) << (4 * (i & 1)));
    }
}

static int int4_at(const uint8_t *q, size_t i)
{
    int nib = (q[i / 2] >> (4 * (i & 1))) & 0xF;
    return nib >= 8 ? nib - 16 : nib;
}

static size_t scales_at(size_t n, int bits)
{
    size_t values = bits == 4 ? (n + 1) / 2 : n;
    return (values + 3) / 4 * 4;
}

size_t dt_quant_packet_bytes(size_t n, size_t block, int bits)
{
    return scales_at(n, bits) + dt_quant_blocks(n, block) * sizeof(float);
}

void dt_quant_pack(void *packet, const float *x, size_t n, size_t block, int bits)
{
    float *scales = (float *)((char *)packet + scales_at(n, bits));
    if (bits == 4)
        quant_int4(packet, scales, x, n, block);
    else
        dt_quant_int8(packet, scales, x, n, block);
}

enum { SET, ADD, BF16 };

/* The packet's values into out: set or added (fp32), or rounded to bf16;
 * a block at a time, through a buffer that stays in L1. */
static void unpack(void *out, const void *packet, size_t n, size_t block, int bits, int mode)
{
    const float *scales = (const float *)((const char *)packet + scales_at(n, bits));
    const int8_t *q8 = packet;
    const uint8_t *q4 = packet;
    float v[256];
    for (size_t b = 0, lo = 0; lo < n; b++, lo += block) {
        size_t hi = lo + block < n ? lo + block : n;
        for (size_t c = lo; c < hi; c += 256) {
            size_t m = hi - c < 256 ? hi - c : 256;
            for (size_t k = 0; k < m; k++)
                v[k] = (float)(bits == 4 ? int4_at(q4, c + k) : q8[c + k]) * scales[b];
            float *f = (float *)out + c;
            if (mode == BF16) dt_cast_f32_to_bf16((uint16_t *)out + c, v, m);
            else if (mode == ADD) for (size_t k = 0; k < m; k++) f[k] += v[k];
            else memcpy(f, v, m * sizeof(float));
        }
    }
}

void dt_quant_unpack(float *out, const void *packet, size_t n, size_t block, int bits)
{
    unpack(out, packet, n, block, bits, SET);
}

void dt_quant_unpack_add(float *acc, const void *packet, size_t n, size_t block, int bits)
{
    unpack(acc, packet, n, block, bits, ADD);
}

void dt_quant_unpack_bf16(uint16_t *out, const void *packet, size_t n, size_t block, int bits)
{
    unpack(out, packet, n, block, bits, BF16);
}
