/*
 * The arithmetic the schedules are cut by: balanced blocks of a buffer,
 * ranks round a ring, the largest power of two (where folding starts).
 * Pure, with no insides of the communicator, for the algorithms
 * (algorithms.h) and for whoever counts their steps without running them
 * (the cost model's choice of ranks to sample; the simulator).
 */
#ifndef DT_COMM_ALGO_BLOCKS_H
#define DT_COMM_ALGO_BLOCKS_H

#include <stddef.h>

/* Balanced split of count elements into n blocks: block i's offset/length. */
static inline size_t dt_block_off(size_t count, int n, int i)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    return base * (size_t)i + ((size_t)i < rem ? (size_t)i : rem);
}
static inline size_t dt_block_len(size_t count, int n, int i)
{
    return count / (size_t)n + ((size_t)i < count % (size_t)n ? 1 : 0);
}
static inline int dt_mod(int a, int n) { return ((a % n) + n) % n; }
/* Largest power of two <= p (p >= 1). */
static inline int dt_pow2_floor(int p)
{
    int q = 1;
    while (q * 2 <= p) q *= 2;
    return q;
}

#endif
