/* How ZeRO splits the flat buffers over n ranks, as data: every segment of
 * the layout (a layer, the embeddings, the final LayerNorm) is padded to a
 * multiple of n * DT_NORM_BLOCK floats and cut into n equal pieces, piece r
 * to rank r, as Megatron's distributed optimizer splits each bucket. A
 * rank's shard is its pieces end to end. Cutting every segment (rather than
 * the buffer once) lets each layer's gradients be reduce-scattered as
 * backward finishes it and each layer be gathered alone; pieces of whole
 * norm blocks keep the gradient norm the same bits as one process's. */
#ifndef DT_PARALLEL_ZERO_SHARD_MAP_H
#define DT_PARALLEL_ZERO_SHARD_MAP_H

#include <stddef.h>

#include "model/gpt.h"
#include "model/ranges.h"

typedef struct {
    int n, r;            /* ranks, and this one */
    int nseg;
    size_t *piece;       /* [nseg] floats of every rank's piece of segment s */
    dt_flat_range *mine; /* [nseg] this rank's piece of segment s, and where it sits in the shard */
    size_t len;          /* floats of this rank's shard */
} dt_shard_map;

/* The segment padding a layout needs for n ranks (floats). */
size_t dt_shard_align(int n);
/* The map of rank r of n over m, whose segments are padded to
 * dt_shard_align(n): of the segments that lie within `held` (NULL:
 * all); the others have no pieces (piece 0, an empty range). 0, or -1
 * (out of memory, or a layout not padded). */
int dt_shard_map_build(dt_shard_map *s, const dt_gpt *m, int n, int r,
                       const dt_flat_ranges *held);
void dt_shard_map_free(dt_shard_map *s);
/* The non-empty pieces, into out (room for nseg). */
dt_flat_ranges dt_shard_map_ranges(const dt_shard_map *s, dt_flat_range *out);

#endif
