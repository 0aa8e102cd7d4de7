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

/* Whether floats [lo, hi) lie within one of r's ranges; r NULL: the whole
 * layout, so yes. */
int dt_flat_ranges_cover(const dt_flat_ranges *r, size_t lo, size_t hi);

/* The parts of a's ranges that lie within b's (any ranges of the same
 * layout), each keeping its place in a's shard: at moves with lo. Written
 * to out (room for a->n + b->n ranges); returns them with a's len. Both
 * ascending and disjoint, so the result is too. */
dt_flat_ranges dt_flat_ranges_within(const dt_flat_ranges *a, const dt_flat_ranges *b,
                                     dt_flat_range *out);

/* a's ranges (of a rank's own flat layout, `at` in its shard buffers)
 * moved into a larger layout that holds the rank's layout as map's
 * ranges (lo, hi: floats of the larger layout, at: of the rank's): a's
 * parts that map covers, split where map's ranges end, with lo, hi in the
 * larger layout and a's at. Written to out (room for a->n + map->n); a's
 * len. Both ascending, so the result is. A tensor-parallel rank's ranges
 * so become ranges of the whole model, which checkpoints are in. */
dt_flat_ranges dt_flat_ranges_compose(const dt_flat_ranges *a, const dt_flat_ranges *map,
                                      dt_flat_range *out);

#endif
