/* The vocabulary's tables. See vocab.h. */
#include "tokenizer/vocab.h"

#include <stdlib.h>
#include <string.h>

int dt_vocab_init(dt_vocab *v, uint32_t n)
{
    *v = (dt_vocab){.n = n, .eot = -1};
    v->off = calloc(n ? n : 1, sizeof *v->off);
    v->len = calloc(n ? n : 1, sizeof *v->len);
    if (!v->off || !v->len || dt_bytemap_init(&v->ids, n) != 0) {
        dt_vocab_free(v);
        return -1;
    }
    return 0;
}

void dt_vocab_free(dt_vocab *v)
{
    free(v->off);
    free(v->len);
    free(v->bytes);
    free(v->merges);
    dt_bytemap_free(&v->ids);
    *v = (dt_vocab){.eot = -1};
}

static int reserve_bytes(dt_vocab *v, size_t n)
{
    if (v->nbytes + n <= v->bytes_cap) return 0;
    size_t cap = v->bytes_cap ? v->bytes_cap : 1 << 16;
    while (cap < v->nbytes + n) cap *= 2;
    unsigned char *p = realloc(v->bytes, cap);
    if (!p) return -1;
    v->bytes = p;
    v->bytes_cap = cap;
    return 0;
}

int dt_vocab_set(dt_vocab *v, uint32_t id, const void *p, size_t n, int special,
                 uint32_t *other)
{
    uint64_t h = dt_bytes_hash(p, n);
    const uint32_t *have = special ? NULL : dt_bytemap_find(&v->ids, v->bytes, p, n, h);
    if (have) return *other = *have, 1;
    if (n > UINT32_MAX || v->nbytes + n > UINT32_MAX || reserve_bytes(v, n) != 0) return -1;
    memcpy(v->bytes + v->nbytes, p, n);
    v->off[id] = (uint32_t)v->nbytes;
    v->len[id] = (uint32_t)n;
    v->nbytes += n;
    if (special) return 0;
    return dt_bytemap_put(&v->ids, v->off[id], (uint32_t)n, h, id);
}

static int grow_merges(dt_vocab *v)
{
    size_t cap = v->merges_cap ? 2 * v->merges_cap : 1 << 12;
    dt_merge *m = malloc(cap * sizeof *m);
    if (!m) return -1;
    memset(m, 0xFF, cap * sizeof *m);
    for (size_t i = 0; i < v->merges_cap; i++) {
        if (v->merges[i].key == DT_MERGE_FREE) continue;
        size_t j = (v->merges[i].key * 0x9E3779B97F4A7C15ull) >> 20 & (cap - 1);
        while (m[j].key != DT_MERGE_FREE) j = (j + 1) & (cap - 1);
        m[j] = v->merges[i];
    }
    free(v->merges);
    v->merges = m;
    v->merges_cap = cap;
    return 0;
}

int dt_vocab_add_merge(dt_vocab *v, uint32_t left, uint32_t right, uint32_t rank, uint32_t id)
{
    if (2 * (v->nmerges + 1) > v->merges_cap && grow_merges(v) != 0) return -1;
    uint64_t key = (uint64_t)left << 32 | right;
    size_t mask = v->merges_cap - 1;
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> 20 & mask;
    while (v->merges[i].key != DT_MERGE_FREE && v->merges[i].key != key) i = (i + 1) & mask;
    if (v->merges[i].key == DT_MERGE_FREE) v->nmerges++;
    v->merges[i] = (dt_merge){key, rank, id};
    return 0;
}

int dt_vocab_find_bytes(dt_vocab *v, int *missing)
{
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        int64_t id = dt_vocab_find(v, &c, 1);
        if (id < 0) return *missing = b, -1;
        v->byte_id[b] = (uint32_t)id;
    }
    return 0;
}

int dt_vocab_check_dense(const dt_vocab *v, uint32_t upto, uint32_t *hole)
{
    for (uint32_t id = 0; id < upto && id < v->n; id++)
        if (v->len[id] == 0) return *hole = id, -1;
    return 0;
}

int dt_vocab_merges_from_tokens(dt_vocab *v)
{
    for (uint32_t id = 0; id < v->n; id++) {
        if ((int32_t)id == v->eot) continue;
        const unsigned char *p = v->bytes + v->off[id];
        for (uint32_t cut = 1; cut < v->len[id]; cut++) {
            int64_t left = dt_vocab_find(v, p, cut);
            int64_t right = left < 0 ? -1 : dt_vocab_find(v, p + cut, v->len[id] - cut);
            if (right >= 0 && dt_vocab_add_merge(v, (uint32_t)left, (uint32_t)right, id, id))
                return -1;
        }
    }
    return 0;
}

static uint64_t mix(uint64_t h)
{
    h = (h ^ (h >> 31)) * 0x7FB5D329728EA185ull;
    h = (h ^ (h >> 27)) * 0x81DADEF4BC2DD44Dull;
    return h ^ (h >> 33);
}

uint64_t dt_vocab_fingerprint(const dt_vocab *v)
{
    uint64_t h = mix(v->n) ^ mix((uint64_t)(uint32_t)v->eot + 1) ^ mix(v->tiktoken + 7);
    for (uint32_t id = 0; id < v->n; id++)
        h = mix(h ^ dt_bytes_hash(v->bytes + v->off[id], v->len[id]));
    /* The merges' table order depends on how it grew: a sum does not. */
    uint64_t sum = 0;
    for (size_t i = 0; i < v->merges_cap; i++) {
        const dt_merge *m = &v->merges[i];
        if (m->key != DT_MERGE_FREE) sum += mix(m->key ^ mix((uint64_t)m->rank << 32 | m->id));
    }
    return mix(h ^ sum);
}
