/*
 * Array casts between fp32 and bf16 / f16: bf16 rounding against the
 * test's own nearest-value reference over random bit patterns (NaN, inf,
 * subnormals, ties included), f16 widening against a decode written with
 * ldexp for all 65536 patterns, f16 narrowing by round trip of every f16
 * value and against the CPU's own conversion where it has one; sizes that
 * exercise vector tails and the threaded split.
 */
#include "bf16_ref.h"
#include "kernel_test.h"
#include "kernels/cast.h"
#include "kernels/threads.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 bits expected for x: NaN stays NaN, made quiet, sign and top payload kept */
static uint16_t want_bf16(float x)
{
    uint32_t u = bits_of(x);
    if (isnan(x)) return (uint16_t)((u | 0x00400000u) >> 16);
    return (uint16_t)(bits_of(ref_bf16_round(x)) >> 16);
}

static float random_float(void)
{
    uint32_t u = (uint32_t)rnd_u64();
    switch (rnd_u64() % 8) {
    case 0: u &= 0x807fffffu; break;                 /* subnormal or zero */
    case 1: u = (u & 0xffff0000u) | 0x8000u; break;  /* an exact tie */
    case 2: u |= 0x7f800000u; break;                 /* inf or NaN */
    default: break;
    }
    return float_of(u);
}

static void check_bf16(size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof *x), *back = malloc((n ? n : 1) * sizeof *back);
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) x[i] = random_float();
    dt_cast_f32_to_bf16(h, x, n);
    dt_cast_bf16_to_f32(back, h, n);
    int bad = 0, bad_back = 0;
    for (size_t i = 0; i < n; i++) {
        bad += h[i] != want_bf16(x[i]);
        bad_back += bits_of(back[i]) != (uint32_t)h[i] << 16;
    }
    CHECK(bad == 0, "f32 -> bf16, n=%zu: %d wrong", n, bad);
    CHECK(bad_back == 0, "bf16 -> f32, n=%zu: %d wrong", n, bad_back);
    free(x), free(back), free(h);
}

/* f16 value from its definition; NaN patterns as quiet NaN with payload */
static uint32_t want_f16_widened(uint16_t h)
{
    unsigned e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    if (e == 31) return sign | 0x7f800000u | (m ? 0x00400000u | (uint32_t)m << 13 : 0);
    double v = e == 0 ? ldexp(m, -24) : ldexp(m + 1024, (int)e - 25);
    return sign | bits_of((float)v);
}

static void check_f16_all_patterns(void)
{
    enum { n = 65536 };
    uint16_t *h = malloc(n * sizeof *h), *again = malloc(n * sizeof *again);
    float *f = malloc(n * sizeof *f);
    for (int i = 0; i < n; i++) h[i] = (uint16_t)i;
    dt_cast_f16_to_f32(f, h, n);
    dt_cast_f32_to_f16(again, f, n);
    int bad = 0, bad_trip = 0;
    for (int i = 0; i < n; i++) {
        bad += bits_of(f[i]) != want_f16_widened(h[i]);
        int is_nan = (h[i] & 0x7fff) > 0x7c00;
        bad_trip += again[i] != (is_nan ? (h[i] | 0x0200) : h[i]);
    }
    CHECK(bad == 0, "f16 -> f32: %d of all patterns wrong", bad);
    CHECK(bad_trip == 0, "f16 -> f32 -> f16: %d of all patterns changed", bad_trip);
    free(h), free(again), free(f);
}

static void check_f16_narrowing(size_t n)
{
#if defined(__F16C__)
    float *x = malloc((n ? n : 1) * sizeof *x);
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) x[i] = random_float();
    dt_cast_f32_to_f16(h, x, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += h[i] != _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
    CHECK(bad == 0, "f32 -> f16 against the CPU's conversion, n=%zu: %d wrong", n, bad);
    free(x), free(h);
#else
    (void)n;
#endif
}

int main(void)
{
    static const size_t sizes[] = {0, 1, 15, 16, 17, 100, (1 << 20) + 3};
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            check_bf16(sizes[i]);
            check_f16_narrowing(sizes[i]);
        }
        check_f16_all_patterns();
    }
    return finish("test_cast");
}
