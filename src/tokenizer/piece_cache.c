/* See piece_cache.h. The arenas are sized once, at their bounds, so a
 * put never moves them. */
#include "tokenizer/piece_cache.h"

#include <stdlib.h>
#include <string.h>

/* About 20 MB in all, for 262,144 pieces (an English text of 10 MB has
 * some 60,000 different ones). */
#define MAX_PIECES (1u << 18)
#define KEYS_BYTES (4u << 20)
#define IDS_COUNT (1u << 20)

int dt_piece_cache_init(dt_piece_cache *c)
{
    *c = (dt_piece_cache){0};
    c->keys = malloc(KEYS_BYTES);
    c->ids = malloc(IDS_COUNT * sizeof *c->ids);
    c->keys_cap = KEYS_BYTES;
    c->ids_cap = IDS_COUNT;
    if (c->keys && c->ids && dt_bytemap_init(&c->map, 4096) == 0) return 0;
    dt_piece_cache_free(c);
    return -1;
}

void dt_piece_cache_free(dt_piece_cache *c)
{
    free(c->keys);
    free(c->ids);
    dt_bytemap_free(&c->map);
    *c = (dt_piece_cache){0};
}

int dt_piece_cache_put(dt_piece_cache *c, const unsigned char *p, size_t n, uint64_t h,
                       const uint32_t *ids, size_t count)
{
    if (c->map.n >= MAX_PIECES || c->nkeys + n > c->keys_cap || c->nids + 1 + count > c->ids_cap) {
        dt_bytemap_clear(&c->map);
        c->nkeys = c->nids = 0;
    }
    memcpy(c->keys + c->nkeys, p, n);
    uint32_t val = (uint32_t)c->nids;
    if (count == 1 && ids[0] < DT_PIECE_ONE) {
        val = ids[0] | DT_PIECE_ONE;
    } else {
        c->ids[c->nids] = (uint32_t)count;
        memcpy(c->ids + c->nids + 1, ids, count * sizeof *ids);
        c->nids += 1 + count;
    }
    if (dt_bytemap_put(&c->map, (uint32_t)c->nkeys, (uint32_t)n, h, val) != 0) return -1;
    c->nkeys += n;
    return 0;
}
