/* splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and fully specified, so
 * every machine and every resumed run draws the same numbers (weight
 * initialisation, data shuffling, sampling). */
#ifndef DT_CORE_RAND_H
#define DT_CORE_RAND_H

#include <stdint.h>

/* The splitmix64 finaliser: a bijective scramble of z. */
static inline uint64_t dt_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#define DT_SPLITMIX_GAMMA 0x9E3779B97F4A7C15ull

/* The next number of the stream whose state is *state. */
static inline uint64_t dt_splitmix64(uint64_t *state)
{
    *state += DT_SPLITMIX_GAMMA;
    return dt_mix64(*state);
}

/* Number k (from 0) of the stream that starts at state0, without the ones
 * before it: the state only ever grows by the same constant. */
static inline uint64_t dt_splitmix64_at(uint64_t state0, uint64_t k)
{
    return dt_mix64(state0 + (k + 1) * DT_SPLITMIX_GAMMA);
}

/* An integer below 2^52 as a double, exactly: placed in the mantissa of
 * 2^52 and 2^52 taken off. AVX2 has no conversion of 64-bit integers, so
 * `(double)v` would keep an AVX2 loop scalar; this vectorizes. */
static inline __attribute__((always_inline)) double dt_u52_to_double(uint64_t v)
{
    union { uint64_t u; double d; } b = {.u = v | 0x4330000000000000ull};
    return b.d - 4503599627370496.0;
}

/* x's top 53 bits as a number in [0, 1): (x >> 11) 2^-53, its bits as 32
 * high and 21 low, each converted exactly (so a loop over it vectorizes;
 * core/normal.h). */
static inline __attribute__((always_inline)) double dt_unit_from_bits(uint64_t x)
{
    const double hi = dt_u52_to_double(x >> 32), lo = dt_u52_to_double((x >> 11) & 0x1FFFFF);
    return (hi * 2097152.0 + lo) * (1.0 / 9007199254740992.0); /* every step exact */
}

/* Uniform in [0, 1), on 53 bits. */
static inline double dt_uniform01(uint64_t *state) { return dt_unit_from_bits(dt_splitmix64(state)); }

/* dt_uniform01's number k of the stream that starts at state0. */
static inline __attribute__((always_inline)) double dt_uniform01_at(uint64_t state0, uint64_t k)
{
    return dt_unit_from_bits(dt_splitmix64_at(state0, k));
}

#endif
