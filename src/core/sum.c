/* The lane fingerprint of core/sum.h. */
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/sum.h"

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

void dt_sum_init(dt_sum *s)
{
    *s = (dt_sum){.h = {1469598103934665603ull, 1ull, 2ull, 3ull}};
}

void dt_sum_add(dt_sum *s, const void *p, size_t n)
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
static void copy_blocks(dt_sum *s, unsigned char *d, const unsigned char *b, size_t blocks)
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

void dt_sum_copy(dt_sum *s, void *dst, const void *src, size_t n)
{
    unsigned char *d = dst;
    const unsigned char *b = src;
    size_t head = (32 - s->n % 32) % 32;
    if (head > n || (uintptr_t)(d + head) % 8 != 0) head = n; /* not aligned: the plain way */
    memcpy(d, b, head);
    dt_sum_add(s, b, head);
    d += head, b += head, n -= head;
    copy_blocks(s, d, b, n / 32);
    const size_t done = n / 32 * 32;
    memcpy(d + done, b + done, n - done);
    dt_sum_add(s, b + done, n - done);
}

uint64_t dt_sum_end(const dt_sum *s)
{
    uint64_t x = s->h[0];
    for (int l = 1; l < 4; l++) x = (x ^ s->h[l]) * SUM_PRIME;
    for (unsigned i = 0; i < s->npend; i++) x = (x ^ s->pend[i]) * SUM_PRIME;
    return (x ^ s->n) * SUM_PRIME;
}

uint64_t dt_sum64(const void *p, size_t n)
{
    dt_sum s;
    dt_sum_init(&s);
    dt_sum_add(&s, p, n);
    return dt_sum_end(&s);
}
