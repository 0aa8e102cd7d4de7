/*
 * Scalar 16-bit float conversions: bf16 and IEEE f16 <-> f32.
 *
 * Used by the reduce loops of the communication layer and by the kernels'
 * casts, so they are static inline: inside a loop they vectorise.
 *
 * They are written as integer bit manipulation with selects instead of
 * branches, so that they vectorise and do not depend on the FPU's denormal
 * flags (FTZ/DAZ), which some math libraries switch on.
 */
#ifndef DT_CORE_HALF_H
#define DT_CORE_HALF_H

#include <stdint.h>
#include <string.h>

/* ---- bit casts ---------------------------------------------------------- */

static inline uint32_t dt_f32_as_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float dt_bits_as_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- bf16 --------------------------------------------------------------- */

/* bf16 is the top half of an f32, so widening is exact and a shift. */
static inline float dt_bf16_to_f32(uint16_t h) { return dt_bits_as_f32((uint32_t)h << 16); }

/* Round to nearest, ties to even, leaving the bf16 result in the top half
 * of the returned f32 bits: adding 0x7fff plus the lowest kept bit carries
 * into the kept half exactly when the dropped half is above one half, or
 * equal to it with an odd kept half. A carry out of the mantissa correctly
 * bumps the exponent (up to infinity). NaN must not be rounded (it could
 * carry into infinity), so it is only made quiet. */
static inline uint32_t dt_bf16_rounded_bits(float f)
{
    uint32_t u = dt_f32_as_bits(f);
    int is_nan = (u & 0x7fffffffu) > 0x7f800000u;
    return is_nan ? (u | 0x00400000u) : (u + 0x7fffu + ((u >> 16) & 1u));
}

static inline uint16_t dt_f32_to_bf16(float f) { return (uint16_t)(dt_bf16_rounded_bits(f) >> 16); }

/* ---- f16 ---------------------------------------------------------------- */

/* Normals only need the exponent rebiased; infinities and NaNs get the
 * all-ones exponent instead (NaNs quietened, as the hardware conversion
 * does). An f16 subnormal m * 2^-24 (m < 1024) becomes an f32 normal by
 * moving m's leading one to the implicit bit. All integer: a float
 * operation here would be sunk into a branch by the compiler (it may
 * trap), which stops the loops around it from vectorising. */
static inline float dt_f16_to_f32(uint16_t h)
{
    const uint32_t f32_bias = 127, f16_bias = 15;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t mag = h & 0x7fffu;
    uint32_t rebias = mag >= 0x7c00u ? (uint32_t)(255 - 31) << 23 : (f32_bias - f16_bias) << 23;
    uint32_t quiet = (uint32_t)(mag > 0x7c00u) << 22;
    uint32_t normal = ((mag << 13) + rebias) | quiet;
    uint32_t lead = 31u - (uint32_t)__builtin_clz(mag | 1u); /* bit index of m's top one */
    uint32_t sub_exp = lead + f32_bias - 24u;
    uint32_t subnormal = (sub_exp << 23) | ((mag << (23u - lead)) & 0x007fffffu);
    subnormal = mag == 0 ? 0u : subnormal;
    uint32_t bits = mag < 0x0400u ? subnormal : normal;
    return dt_bits_as_f32(bits | sign);
}

static inline uint16_t dt_f32_to_f16(float f)
{
    const uint32_t f32_bias = 127, f16_bias = 15;
    const uint32_t bits_2pow16 = 0x47800000u;  /* 65536: at or above, the result is inf */
    const uint32_t bits_2powm14 = 0x38800000u; /* smallest f16 normal */
    const uint32_t bits_half = 0x3f000000u;    /* 0.5 */
    uint32_t u = dt_f32_as_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    /* Normal: rebias, then round to nearest even at bit 13 (same carry
     * trick as bf16); values from 65520 up carry into the inf pattern. */
    uint32_t n = a - ((f32_bias - f16_bias) << 23);
    uint32_t normal = (n + 0x0fffu + ((n >> 13) & 1u)) >> 13;
    /* Below 2^-14 the result is a multiple of 2^-24. Adding 0.5 puts the
     * value where the f32 ulp is 2^-24, so the FPU's own round-to-nearest-
     * even does the rounding; the mantissa bits are then the f16 result
     * (1024 = the smallest normal, which is also the right encoding). */
    uint32_t subnormal = dt_f32_as_bits(dt_bits_as_f32(a) + 0.5f) - bits_half;
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x03ffu);
    uint32_t r = a < bits_2powm14 ? subnormal : normal;
    r = a >= bits_2pow16 ? 0x7c00u : r;
    r = a > 0x7f800000u ? nan : r;
    return (uint16_t)(r | sign);
}

#endif
