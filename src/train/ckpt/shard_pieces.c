/* A rank's ranges of the flat layout as pieces of named tensors: the
 * range arithmetic that makes a checkpoint independent of the layout's
 * padding. See ckpt/shard.h. */
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/str.h"
#include "train/ckpt/shard.h"

static int check_ranges(const dt_gpt *layout, const dt_flat_ranges *mine, char *err,
                        size_t errlen)
{
    for (int i = 0; i < mine->n; i++) {
        const dt_flat_range *r = &mine->r[i];
        const char *why = NULL;
        if (r->lo > r->hi)
            why = "ends before it starts";
        else if (r->hi > layout->n_floats)
            why = "ends past the layout's flat buffer";
        else if (r->at > mine->len || r->hi - r->lo > mine->len - r->at)
            why = "ends past the shard buffers";
        else if (i > 0 && r->lo < mine->r[i - 1].hi)
            why = "is not after the range before it (ranges must be ascending and disjoint)";
        if (!why) continue;
        dt_strf(err, errlen,
                "range %d, floats [%zu, %zu) at %zu, %s (layout of %zu floats, shard of %zu)", i,
                r->lo, r->hi, r->at, why, layout->n_floats, mine->len);
        return -1;
    }
    return 0;
}

int dt_ckpt_pieces(const dt_gpt *layout, const dt_flat_ranges *mine, dt_ckpt_piece **out,
                   int *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    if (check_ranges(layout, mine, err, errlen) != 0) return -1;
    /* A tensor meets each range at most once. */
    size_t cap = (size_t)mine->n + (size_t)layout->n_tensors;
    dt_ckpt_piece *p = calloc(cap ? cap : 1, sizeof *p);
    if (!p) {
        dt_strf(err, errlen, "out of memory for %zu checkpoint pieces", cap);
        return -1;
    }
    int count = 0;
    for (int i = 0; i < mine->n; i++) {
        const dt_flat_range *r = &mine->r[i];
        for (int k = 0; k < layout->n_tensors; k++) {
            const dt_param_tensor *t = &layout->tensors[k];
            size_t lo = r->lo > t->offset ? r->lo : t->offset;
            size_t hi = r->hi < t->offset + t->numel ? r->hi : t->offset + t->numel;
            if (lo >= hi) continue;
            p[count++] = (dt_ckpt_piece){.tensor = k, .lo = lo - t->offset,
                                         .hi = hi - t->offset, .at = r->at + (lo - r->lo)};
        }
    }
    *out = p;
    *n = count;
    return 0;
}

void dt_ckpt_shard_name(char *buf, size_t len, int rank, int ranks)
{
    dt_strf(buf, len, "shard-%05d-of-%05d.safetensors", rank, ranks);
}

void dt_ckpt_piece_name(char *buf, size_t len, const char *prefix, const char *tensor,
                        uint64_t lo)
{
    dt_strf(buf, len, "%s%s@%llu", prefix, tensor, (unsigned long long)lo);
}

/* FNV-1a over 8-byte words in four interleaved lanes (a byte at a time
 * would take seconds on a large shard), then the tail bytes. Streamed:
 * whole 32-byte blocks go to the lanes as they arrive, a block cut
 * between two calls waits in pend. */
#define SUM_PRIME 1099511628211ull

static void sum_block(uint64_t h[4], const unsigned char *b)
{
    for (int l = 0; l < 4; l++) {
        uint64_t w;
        memcpy(&w, b + 8 * l, 8);
        h[l] = (h[l] ^ w) * SUM_PRIME;
    }
}

void dt_ckpt_sum_init(dt_ckpt_sum *s)
{
    *s = (dt_ckpt_sum){.h = {1469598103934665603ull, 1ull, 2ull, 3ull}};
}

void dt_ckpt_sum_add(dt_ckpt_sum *s, const void *p, size_t n)
{
    const unsigned char *b = p;
    s->n += n;
    if (s->npend) {
        size_t take = 32 - s->npend < n ? 32 - s->npend : n;
        memcpy(s->pend + s->npend, b, take);
        s->npend += (unsigned)take;
        b += take;
        n -= take;
        if (s->npend < 32) return;
        sum_block(s->h, s->pend);
        s->npend = 0;
    }
    for (; n >= 32; b += 32, n -= 32) sum_block(s->h, b);
    memcpy(s->pend, b, n);
    s->npend = (unsigned)n;
}

/* Whole blocks: each word summed and stored past the cache (movnti), so a
 * copy of the state reads it once and writes it once, and evicts nothing
 * the training threads use. dst must be 8-byte aligned. */
static void copy_blocks(dt_ckpt_sum *s, unsigned char *d, const unsigned char *b, size_t blocks)
{
#if defined(__x86_64__)
    for (size_t i = 0; i < blocks; i++, b += 32, d += 32) {
        for (int l = 0; l < 4; l++) {
            uint64_t w;
            memcpy(&w, b + 8 * l, 8);
            s->h[l] = (s->h[l] ^ w) * SUM_PRIME;
            _mm_stream_si64((long long *)(void *)(d + 8 * l), (long long)w);
        }
    }
    _mm_sfence();
#else
    memcpy(d, b, blocks * 32);
    for (size_t i = 0; i < blocks; i++) sum_block(s->h, b + 32 * i);
#endif
    s->n += blocks * 32;
}

void dt_ckpt_sum_copy(dt_ckpt_sum *s, void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *b = src;
    size_t head = (32 - s->n % 32) % 32;
    if (head > n || (uintptr_t)(d + head) % 8 != 0) head = n; /* not aligned: the plain way */
    memcpy(d, b, head);
    dt_ckpt_sum_add(s, b, head);
    d += head, b += head, n -= head;
    copy_blocks(s, d, b, n / 32);
    const size_t done = n / 32 * 32;
    memcpy(d + done, b + done, n - done);
    dt_ckpt_sum_add(s, b + done, n - done);
}

uint64_t dt_ckpt_sum_end(const dt_ckpt_sum *s)
{
    uint64_t x = s->h[0];
    for (int l = 1; l < 4; l++) x = (x ^ s->h[l]) * SUM_PRIME;
    for (unsigned i = 0; i < s->npend; i++) x = (x ^ s->pend[i]) * SUM_PRIME;
    return (x ^ s->n) * SUM_PRIME;
}

uint64_t dt_ckpt_checksum(const void *p, size_t n)
{
    dt_ckpt_sum s;
    dt_ckpt_sum_init(&s);
    dt_ckpt_sum_add(&s, p, n);
    return dt_ckpt_sum_end(&s);
}
