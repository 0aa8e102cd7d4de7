/* The merge loop. See bpe.h. The piece's tokens are a linked list over
 * byte positions (a token is named by where it starts); a candidate in
 * the heap is stale once either of its tokens has merged with something
 * else, which its recorded ids tell. */
#include "tokenizer/bpe.h"

#include <stdlib.h>

#define NONE UINT32_MAX

void dt_bpe_scratch_free(dt_bpe_scratch *s)
{
    free(s->id);
    free(s->next);
    free(s->prev);
    free(s->heap);
    *s = (dt_bpe_scratch){0};
}

static int reserve(dt_bpe_scratch *s, size_t n)
{
    if (n <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    /* Each merge adds at most two candidates to the n - 1 first ones. */
    size_t heap_cap = 3 * cap;
    uint32_t *id = realloc(s->id, cap * sizeof *id);
    if (id) s->id = id;
    uint32_t *next = realloc(s->next, cap * sizeof *next);
    if (next) s->next = next;
    uint32_t *prev = realloc(s->prev, cap * sizeof *prev);
    if (prev) s->prev = prev;
    dt_bpe_cand *heap = realloc(s->heap, heap_cap * sizeof *heap);
    if (heap) s->heap = heap;
    if (!id || !next || !prev || !heap) return -1;
    s->cap = cap;
    s->heap_cap = heap_cap;
    return 0;
}

static void heap_push(dt_bpe_cand *h, size_t *n, dt_bpe_cand c)
{
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2].key > c.key) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static dt_bpe_cand heap_pop(dt_bpe_cand *h, size_t *n)
{
    dt_bpe_cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].key < h[c].key) c++;
        if (h[c].key >= last.key) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* The pair at i and its right neighbour j, when they merge. */
static void consider(const dt_vocab *v, dt_bpe_scratch *s, size_t *nheap, uint32_t i, uint32_t j)
{
    const dt_merge *m = dt_vocab_merge(v, s->id[i], s->id[j]);
    if (m) heap_push(s->heap, nheap, (dt_bpe_cand){(uint64_t)m->rank << 32 | i, s->id[i],
                                                   s->id[j], m->id});
}

int64_t dt_bpe_encode(const dt_vocab *v, const unsigned char *p, size_t n, dt_bpe_scratch *s,
                      uint32_t *out)
{
    if (n >= NONE || reserve(s, n) != 0) return -1;
    for (uint32_t i = 0; i < n; i++) {
        s->id[i] = v->byte_id[p[i]];
        s->next[i] = i + 1 < n ? i + 1 : NONE;
        s->prev[i] = i ? i - 1 : NONE;
    }
    size_t nheap = 0;
    for (uint32_t i = 0; i + 1 < n; i++) consider(v, s, &nheap, i, i + 1);
    while (nheap) {
        dt_bpe_cand c = heap_pop(s->heap, &nheap);
        uint32_t i = (uint32_t)c.key, j = s->next[i];
        if (s->id[i] != c.left || j == NONE || s->id[j] != c.right) continue; /* stale */
        s->id[i] = c.id;
        s->id[j] = NONE;
        s->next[i] = s->next[j];
        if (s->next[j] != NONE) s->prev[s->next[j]] = i;
        if (s->prev[i] != NONE) consider(v, s, &nheap, s->prev[i], i);
        if (s->next[i] != NONE) consider(v, s, &nheap, i, s->next[i]);
    }
    int64_t k = 0;
    for (uint32_t i = 0; i != NONE; i = s->next[i]) out[k++] = s->id[i];
    return k;
}
