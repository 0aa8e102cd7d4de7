/* A fingerprint of a buffer's bytes, fast enough for the whole model
 * (that ranks hold the same weights, that a checkpoint's file is whole):
 * FNV-1a over 8-byte words in four interleaved lanes, at memory speed
 * where dt_fnv1a64's byte at a time takes half a second a gigabyte.
 * Stable across builds (checkpoints store it); never for security. */
#ifndef DT_CORE_SUM_H
#define DT_CORE_SUM_H

#include <stddef.h>
#include <stdint.h>

/* Streamed: the same value for the same bytes however they are cut. */
typedef struct {
    uint64_t h[4], n;
    unsigned char pend[32];
    unsigned npend;
} dt_sum;
void dt_sum_init(dt_sum *s);
void dt_sum_add(dt_sum *s, const void *p, size_t n);
uint64_t dt_sum_end(const dt_sum *s);
/* memcpy(dst, src, n) and dt_sum_add(s, src, n) in one pass; dst at the
 * same place modulo 32 as the stream's position (a mapping of the file
 * being summed) takes the fast way, stored past the cache. */
void dt_sum_copy(dt_sum *s, void *dst, const void *src, size_t n);

/* The sum of n bytes in one call. */
uint64_t dt_sum64(const void *p, size_t n);

#endif
