/* A rank's part of the flat buffers as data: ranges of the model's flat
 * layout and where each sits in the rank's own (shard) buffers. ZeRO's
 * shards, checkpoint shards and the optimizer's state are described by
 * them, so converting one layout into another is range arithmetic. */
#ifndef DT_MODEL_RANGES_H
#define DT_MODEL_RANGES_H

#include <stddef.h>

/* Floats [lo, hi) of the flat layout, stored from float `at` of the shard. */
typedef struct {
    size_t lo, hi, at;
} dt_flat_range;

/* Ascending, disjoint ranges; len: floats of the shard buffers (padding
 * included, so len >= the sum of the ranges' lengths). */
typedef struct {
    int n;
    const dt_flat_range *r;
    size_t len;
} dt_flat_ranges;

#endif
