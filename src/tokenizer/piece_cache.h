/* The tokens of pieces seen before. Text repeats its words, so most
 * pieces are found here and never merged again: the cache is what makes
 * encoding run at tens of MB/s. It forgets everything when it outgrows
 * its bounds, which costs a few merges and keeps memory flat on any
 * input. */
#ifndef DT_TOKENIZER_PIECE_CACHE_H
#define DT_TOKENIZER_PIECE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/bytemap.h"

/* Longer pieces are rare and would crowd the short ones out. */
#define DT_PIECE_CACHE_MAX_LEN 64

/* A piece of one token keeps it in the map's value, marked by this bit:
 * most pieces are one token, and so need no second look-up. */
#define DT_PIECE_ONE 0x80000000u

typedef struct {
    dt_bytemap map;      /* piece -> its token | DT_PIECE_ONE, or where its count and ids
                          * start in ids */
    unsigned char *keys; /* the pieces' bytes */
    size_t nkeys, keys_cap;
    uint32_t *ids;       /* per piece: its count, then its ids */
    size_t nids, ids_cap;
} dt_piece_cache;

int dt_piece_cache_init(dt_piece_cache *c);
void dt_piece_cache_free(dt_piece_cache *c);

/* The count of piece p's ids (n bytes, hash h), 0 when it is not here;
 * the ids in *ids (in *one, when one). */
static inline size_t dt_piece_cache_find(const dt_piece_cache *c, const unsigned char *p,
                                         size_t n, uint64_t h, const uint32_t **ids,
                                         uint32_t *one)
{
    const uint32_t *at = dt_bytemap_find(&c->map, c->keys, p, n, h);
    if (!at) return 0;
    if (*at & DT_PIECE_ONE) {
        *one = *at & ~DT_PIECE_ONE;
        *ids = one;
        return 1;
    }
    *ids = c->ids + *at + 1;
    return c->ids[*at];
}

/* Remembers piece p's ids (a piece of at most DT_PIECE_CACHE_MAX_LEN
 * bytes). 0, or -1 when memory runs out. */
int dt_piece_cache_put(dt_piece_cache *c, const unsigned char *p, size_t n, uint64_t h,
                       const uint32_t *ids, size_t count);

#endif
