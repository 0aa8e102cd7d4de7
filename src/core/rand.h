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

/* Uniform in [0, 1), on 53 bits. */
static inline double dt_uniform01(uint64_t *state)
{
    return (double)(dt_splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
}

/* dt_uniform01's number k of the stream that starts at state0. */
static inline double dt_uniform01_at(uint64_t state0, uint64_t k)
{
    return (double)(dt_splitmix64_at(state0, k) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
