/*
 * exp(x) for fp32 kernels, written so that it vectorises.
 *
 * libm's expf is a call the compiler cannot vectorise without -ffast-math,
 * and the softmax, GELU and attention loops spend their time in it. This
 * one reduces x = n ln2 + r with |r| <= ln2/2 (ln2 split in two parts so
 * that r is exact), takes exp(r) from its Taylor series to r^7 (truncation
 * below 1e-8 relative, under an ulp) and scales by 2^n through the exponent
 * bits. Relative error stays within about 2 ulp over the whole range.
 * Results below exp(-87) flush to 0 and above exp(88.37) become +inf; a NaN
 * argument gives NaN (the comparisons below are false for it).
 *
 * The scalar form vectorises inside plain loops; the AVX-512 form is the
 * same computation for kernels written with intrinsics.
 *
 * dt_fast_exp2_512 is 2^x in about half the instructions, for attention's
 * probabilities, where the scale by log2(e) folds into the scale the
 * scores get anyway: x = n + f with |f| <= 1/2 exact, 2^f from its Taylor
 * series in f ln2 to the 7th power (within 1e-7 relative), and 2^n
 * applied by vscalefps, which also gives +inf above 2^128 without a
 * compare. Below x = DT_EXP2_MIN_ARG = -126 the result is 0, never a
 * subnormal: x is raised to that bound first, and the lanes below it are
 * zeroed by the scaling instruction's mask. An underflowing result costs
 * a microcode assist on Intel cores unless the caller flushes denormals
 * (training does, dt_kernels_flush_denormals; bench_kernels and the tests
 * do not), and attention's hidden keys are all such lanes: computed as
 * 2^-150, they made the forward kernel 1.2-1.3x slower on a Sapphire
 * Rapids-class Xeon without the flush. With the flush the results are
 * the same bits as before: what is now 0 was a subnormal, flushed. -inf
 * gives 0, NaN gives NaN.
 *
 * dt_fast_exp2_256 is the same 2^x for AVX2 + FMA, which has no vscalefps:
 * x is clamped to [DT_EXP2_MIN_ARG, 129] and 2^n applied as two powers of
 * two made from exponent bits, 2^(n - n/2) and 2^(n/2), each a normal
 * float (2^129 is not one); the first product is exact, so the result is
 * rounded once and equals dt_fast_exp2_512's.
 */
#ifndef DT_KERNELS_FAST_EXP_H
#define DT_KERNELS_FAST_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define DT_EXP_LOG2E 1.44269504088896341f
#define DT_EXP_LN2_HI 0.693145751953125f /* few mantissa bits: n * hi is exact */
#define DT_EXP_LN2_LO 1.42860682030941723e-6f
#define DT_EXP_ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer */
#define DT_EXP_MIN_ARG (-87.0f)
#define DT_EXP_MAX_ARG 88.37f
#define DT_EXP2_MIN_ARG (-126.0f) /* 2^-126, the smallest normal float */

static inline float dt_exp_poly(float r)
{
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    return fmaf(p, r, 1.0f);
}

static inline float dt_fast_expf(float x)
{
    float shifted = fmaf(x, DT_EXP_LOG2E, DT_EXP_ROUND_MAGIC);
    float n = shifted - DT_EXP_ROUND_MAGIC;
    float r = fmaf(-n, DT_EXP_LN2_HI, x);
    r = fmaf(-n, DT_EXP_LN2_LO, r);
    uint32_t shifted_bits, scale_bits;
    memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
    /* the low bits of `shifted` hold n; move n + 127 into the exponent */
    scale_bits = (shifted_bits - 0x4b400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    float y = dt_exp_poly(r) * scale;
    y = x < DT_EXP_MIN_ARG ? 0.0f : y;
    return x > DT_EXP_MAX_ARG ? INFINITY : y;
}

/* 2^f = exp(f ln2) for |f| <= 1/2: ln2^k / k!, k = 7 down to 0 */
static const float dt_exp2_poly[8] = {1.525273365e-05f, 1.540352969e-04f, 1.333355787e-03f,
                                      9.618128650e-03f, 5.550410971e-02f, 2.402265072e-01f,
                                      6.931471825e-01f, 1.0f};

#if defined(__AVX512F__)
static inline __m512 dt_fast_exp512(__m512 x)
{
    __m512 shifted = _mm512_fmadd_ps(x, _mm512_set1_ps(DT_EXP_LOG2E),
                                     _mm512_set1_ps(DT_EXP_ROUND_MAGIC));
    __m512 n = _mm512_sub_ps(shifted, _mm512_set1_ps(DT_EXP_ROUND_MAGIC));
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DT_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(DT_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i scale_bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(shifted),
                                          _mm512_set1_epi32(0x4b400000)),
                         _mm512_set1_epi32(127)),
        23);
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(scale_bits));
    __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(DT_EXP_MIN_ARG), _CMP_LT_OQ);
    __mmask16 overflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(DT_EXP_MAX_ARG), _CMP_GT_OQ);
    y = _mm512_mask_mov_ps(y, underflow, _mm512_setzero_ps());
    return _mm512_mask_mov_ps(y, overflow, _mm512_set1_ps(INFINITY));
}

static inline __m512 dt_fast_exp2_512(__m512 x)
{
    /* NaN compares "not less" and passes */
    __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(DT_EXP2_MIN_ARG), _CMP_NLT_UQ);
    /* the bound keeps -inf from making f = -inf - -inf; NaN passes */
    x = _mm512_max_ps(_mm512_set1_ps(DT_EXP2_MIN_ARG), x);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(dt_exp2_poly[0]);
#pragma GCC unroll 7
    for (int k = 1; k < 8; k++) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(dt_exp2_poly[k]));
    return _mm512_maskz_scalef_ps(kept, p, n);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 dt_fast_exp2_256(__m256 x)
{
    __m256 kept = _mm256_cmp_ps(x, _mm256_set1_ps(DT_EXP2_MIN_ARG), _CMP_NLT_UQ);
    /* x the second operand: a NaN passes both */
    x = _mm256_max_ps(_mm256_set1_ps(DT_EXP2_MIN_ARG), x);
    x = _mm256_min_ps(_mm256_set1_ps(129.0f), x);
    __m256 shifted = _mm256_add_ps(x, _mm256_set1_ps(DT_EXP_ROUND_MAGIC));
    __m256 f = _mm256_sub_ps(x, _mm256_sub_ps(shifted, _mm256_set1_ps(DT_EXP_ROUND_MAGIC)));
    __m256 p = _mm256_set1_ps(dt_exp2_poly[0]);
#pragma GCC unroll 7
    for (int k = 1; k < 8; k++) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(dt_exp2_poly[k]));
    /* the low bits of `shifted` hold n; n = lo + hi, each within [-63, 65] */
    __m256i n = _mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(0x4b400000));
    __m256i hi = _mm256_srai_epi32(n, 1), lo = _mm256_sub_epi32(n, hi);
    __m256i bias = _mm256_set1_epi32(127);
    __m256 scale_lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(lo, bias), 23));
    __m256 scale_hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(hi, bias), 23));
    return _mm256_and_ps(kept, _mm256_mul_ps(_mm256_mul_ps(p, scale_lo), scale_hi));
}
#endif

#endif
