#include "parallel/zero/shard_map.h"

#include <stdlib.h>
#include <string.h>

#include "model/optimizer.h"

size_t dt_shard_align(int n) { return (size_t)n * DT_NORM_BLOCK; }

int dt_shard_map_build(dt_shard_map *s, const dt_gpt *m, int n, int r,
                       const dt_flat_ranges *held)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    s->r = r;
    s->nseg = dt_gpt_segments(m);
    s->piece = calloc((size_t)s->nseg, sizeof *s->piece);
    s->mine = calloc((size_t)s->nseg, sizeof *s->mine);
    if (!s->piece || !s->mine) return dt_shard_map_free(s), -1;
    for (int k = 0; k < s->nseg; k++) {
        size_t lo = dt_gpt_segment_start(m, k), hi = dt_gpt_segment_start(m, k + 1);
        if ((hi - lo) % dt_shard_align(n) != 0) return dt_shard_map_free(s), -1;
        s->piece[k] = dt_flat_ranges_cover(held, lo, hi) ? (hi - lo) / (size_t)n : 0;
        s->mine[k] = (dt_flat_range){lo + (size_t)r * s->piece[k],
                                     lo + (size_t)(r + 1) * s->piece[k], s->len};
        s->len += s->piece[k];
    }
    return 0;
}

void dt_shard_map_free(dt_shard_map *s)
{
    free(s->piece);
    free(s->mine);
    memset(s, 0, sizeof *s);
}

dt_flat_ranges dt_shard_map_ranges(const dt_shard_map *s, dt_flat_range *out)
{
    int n = 0;
    for (int k = 0; k < s->nseg; k++)
        if (s->piece[k] > 0) out[n++] = s->mine[k];
    return (dt_flat_ranges){n, out, s->len};
}
