/* A hash table from byte strings to 32-bit values, the strings kept by
 * the caller in one arena and named by offset (so the arena may grow and
 * move). The vocabulary maps a token's bytes to its id with it, and the
 * piece cache a piece to where its ids lie. */
#ifndef DT_TOKENIZER_BYTEMAP_H
#define DT_TOKENIZER_BYTEMAP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* 16 bytes, so that a probe touches one cache line: the hash's high half
 * tells most keys apart without reading the arena. */
typedef struct {
    uint32_t tag;      /* hash >> 32, whose low bits are the key's home slot */
    uint32_t off, len; /* the key: arena + off, len bytes (len 0: a free slot) */
    uint32_t val;
} dt_bytemap_slot;

typedef struct {
    dt_bytemap_slot *slots;
    size_t cap; /* a power of two, or 0 */
    size_t n;
} dt_bytemap;

/* A hash of n bytes: eight at a time, for the short keys these are. */
static inline uint64_t dt_bytes_hash(const unsigned char *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 29);
}

/* 0, or -1 when memory runs out. */
int dt_bytemap_init(dt_bytemap *m, size_t expect);
void dt_bytemap_free(dt_bytemap *m);
/* Forgets every key, keeping the table's size. */
void dt_bytemap_clear(dt_bytemap *m);

/* Whether n bytes at a and b are the same: inline, as keys are short. */
static inline int dt_bytes_equal(const unsigned char *a, const unsigned char *b, size_t n)
{
    for (; n >= 8; a += 8, b += 8, n -= 8) {
        uint64_t x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y) return 0;
    }
    for (; n; a++, b++, n--)
        if (*a != *b) return 0;
    return 1;
}

/* The value of key (n >= 1 bytes, hash h = dt_bytes_hash(key, n)), or NULL. */
static inline const uint32_t *dt_bytemap_find(const dt_bytemap *m, const unsigned char *arena,
                                             const unsigned char *key, size_t n, uint64_t h)
{
    if (!m->cap) return NULL;
    const uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = tag & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const dt_bytemap_slot *s = &m->slots[i];
        if (!s->len) return NULL;
        if (s->tag == tag && s->len == n && dt_bytes_equal(arena + s->off, key, n))
            return &s->val;
    }
}

/* Adds the key at arena + off (n >= 1 bytes, hash h), which must not be
 * there yet. 0, or -1 when memory runs out. */
int dt_bytemap_put(dt_bytemap *m, uint32_t off, uint32_t n, uint64_t h, uint32_t val);

#endif
