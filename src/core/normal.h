/* Standard normal numbers of a splitmix64 stream (rand.h), by Box-Muller,
 * with the logarithm and the cosine written out in plain arithmetic.
 *
 * Why not libm's log and cos: a call per element keeps the loop scalar,
 * and GPT-2's 124M weights took 30 ns each on one thread (4 s before the
 * first step). These have no calls and no branches, so a loop over them
 * vectorizes, and they give the same bits in a vector lane as in a scalar
 * tail: each operation is one IEEE operation or an explicit fma, whatever
 * the compiler's contraction setting. Their results are within a few units
 * in the last place of libm's, far below the float the weights are stored
 * in: against glibc's log and cos, 1 float of 50 million drawn moved by
 * one unit, and none of tests/core/test_normal.c's 2^25.
 *
 * The uniforms: u1 in (0, 1) (half a step added, so the log is finite) and
 * u2 in [0, 1), numbers 2g and 2g + 1 of the stream. */
#ifndef DT_CORE_NORMAL_H
#define DT_CORE_NORMAL_H

#include <math.h>
#include <stdint.h>

#include "core/rand.h"

/* c[0] z^(n-1) + c[1] z^(n-2) + ... + c[n-1] by Horner's rule, one fma a
 * step in that order (n a literal at each call, so it unrolls). */
static inline __attribute__((always_inline)) double dt_horner(double z, const double *c, int n)
{
    double p = c[0];
    for (int i = 1; i < n; i++) p = fma(p, z, c[i]);
    return p;
}

/* ln(u) for u in (0, 1]: u = m 2^e with m in [sqrt(1/2), sqrt(2)), and
 * ln(m) = 2 atanh(s) with s = (m - 1) / (m + 1), |s| < 0.172: the odd
 * series of atanh to s^23 (each further term below 2^-60 of the sum). */
static inline __attribute__((always_inline)) double dt_log_unit(double u)
{
    /* a union, not memcpy: GCC vectorizes the one and not the other */
    union { double d; uint64_t u; } b = {.d = u};
    const uint64_t bits = b.u;
    uint64_t biased = bits >> 52; /* u <= 1: no sign bit */
    uint64_t mbits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull; /* [1, 2) */
    /* Above sqrt(2) (mantissa bits 0x6A09E667F3BCD): halve it, one more 2. */
    const uint64_t high = (uint64_t)((bits & 0x000FFFFFFFFFFFFFull) > 0x6A09E667F3BCDull);
    mbits -= high << 52;
    biased += (uint64_t)high;
    b.u = mbits;
    const double m = b.d;
    const double s = (m - 1.0) / (m + 1.0), z = s * s;
    static const double atanh_odd[] = {1.0 / 23, 1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13,
                                        1.0 / 11, 1.0 / 9,  1.0 / 7,  1.0 / 5,  1.0 / 3};
    const double p = dt_horner(z, atanh_odd, 11);
    const double ln_m = fma(2.0 * s * z, p, 2.0 * s);
    /* ln 2 in two parts: the first has zeros below its 32nd bit, so e times
     * it is exact */
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    const double e = dt_u52_to_double(biased) - 1023.0;
    return fma(e, ln2_hi, fma(e, ln2_lo, ln_m));
}

/* cos(2 pi x) for x in [0, 1) on a grid of 2^-53: x = n / 4 + r with
 * |r| <= 1/8 (exact), then the quadrant's sine or cosine of t = 2 pi r,
 * |t| <= pi / 4, by Taylor series to t^19 and t^18. */
static inline __attribute__((always_inline)) double dt_cos_turns(double x)
{
    const double n = nearbyint(4.0 * x), r = fma(n, -0.25, x);
    const double t = r * 6.283185307179586, z = t * t;
    static const double sin_taylor[] = { /* -1/19!, 1/17!, ..., -1/3! */
        -1.0 / 121645100408832000.0, 1.0 / 355687428096000.0, -1.0 / 1307674368000.0,
        1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0, 1.0 / 120.0,
        -1.0 / 6.0};
    static const double cos_taylor[] = { /* 1/18!, -1/16!, ..., 1/2! */
        1.0 / 6402373705728000.0, -1.0 / 20922789888000.0, 1.0 / 87178291200.0,
        -1.0 / 479001600.0, 1.0 / 3628800.0, -1.0 / 40320.0, 1.0 / 720.0, -1.0 / 24.0, 0.5};
    const double s = dt_horner(z, sin_taylor, 9), c = dt_horner(z, cos_taylor, 9);
    const double sin_t = fma(t * z, s, t);
    const double cos_t = fma(-z, c, 1.0);
    /* quadrant n = 0 to 4: cos t, -sin t, -cos t, sin t, cos t (compared as
     * doubles: AVX2 has no conversion to 64-bit integers) */
    const double v = (n == 1.0 || n == 3.0) ? sin_t : cos_t;
    return (n == 1.0 || n == 2.0) ? -v : v;
}

/* Standard normal number g of the stream that starts at state0. */
static inline __attribute__((always_inline)) double dt_normal_at(uint64_t state0, uint64_t g)
{
    const double u1 = dt_uniform01_at(state0, 2 * g) + 0.5 / 9007199254740992.0;
    const double u2 = dt_uniform01_at(state0, 2 * g + 1);
    return sqrt(-2.0 * dt_log_unit(u1)) * dt_cos_turns(u2);
}

#endif
