/* See bytemap.h. Open addressing, linear probing, at most half full. */
#include "tokenizer/bytemap.h"

#include <stdlib.h>

static int resize(dt_bytemap *m, size_t cap)
{
    dt_bytemap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].len) continue;
        size_t j = m->slots[i].tag & (cap - 1);
        while (slots[j].len) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

int dt_bytemap_init(dt_bytemap *m, size_t expect)
{
    size_t cap = 64;
    while (cap < 2 * expect) cap *= 2;
    *m = (dt_bytemap){0};
    return resize(m, cap);
}

void dt_bytemap_free(dt_bytemap *m)
{
    free(m->slots);
    *m = (dt_bytemap){0};
}

void dt_bytemap_clear(dt_bytemap *m)
{
    memset(m->slots, 0, m->cap * sizeof *m->slots);
    m->n = 0;
}

int dt_bytemap_put(dt_bytemap *m, uint32_t off, uint32_t n, uint64_t h, uint32_t val)
{
    if (2 * (m->n + 1) > m->cap && resize(m, m->cap ? 2 * m->cap : 64) != 0) return -1;
    size_t i = (uint32_t)(h >> 32) & (m->cap - 1);
    while (m->slots[i].len) i = (i + 1) & (m->cap - 1);
    m->slots[i] = (dt_bytemap_slot){(uint32_t)(h >> 32), off, n, val};
    m->n++;
    return 0;
}
