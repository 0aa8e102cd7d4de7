/* Deterministic pseudo-random numbers for the comm tests: every rank draws
 * the same value for the same (seed, a, b, what) without talking, so a
 * receiver knows what its sender's message must hold. */
#ifndef DT_TESTS_COMM_DRAW_H
#define DT_TESTS_COMM_DRAW_H

#include <stdint.h>

/* splitmix64's finalizer: every input bit moves every output bit. */
static inline uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static inline uint64_t draw(uint64_t seed, uint64_t a, uint64_t b, uint64_t what)
{
    return mix(seed * 0x9e3779b97f4a7c15ull + a * 1000003u + b * 7919u + what * 104729u);
}

#endif
