/* bf16 rounding for test references, written independently of core/half.h:
 * the two bf16 neighbours of x are found by truncation, and the nearer one
 * wins in double arithmetic, ties to the even pattern. */
#ifndef DT_TESTS_BF16_REF_H
#define DT_TESTS_BF16_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ref_bf16_round(float x)
{
    if (isnan(x) || isinf(x)) return x;
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t down_bits = u & 0xffff0000u, up_bits = down_bits + 0x10000u; /* toward 0, away */
    float down, up;
    memcpy(&down, &down_bits, sizeof down);
    memcpy(&up, &up_bits, sizeof up);
    /* past the largest finite bf16 the next pattern is inf: measure the
     * distance to where it would be, 2^128, so overflow rounds correctly */
    double up_value = isinf(up) ? copysign(ldexp(1.0, 128), x) : (double)up;
    double d_down = fabs((double)x - down), d_up = fabs(up_value - x);
    if (d_down < d_up) return down;
    if (d_up < d_down) return up;
    return ((down_bits >> 16) & 1u) ? up : down;
}

#endif
