/* FNV-1a, 64 bits: a fingerprint of a buffer (that ranks hold the same
 * bytes), a key's bucket in the store's table, a name turned into a number
 * (a port, an id). Fast and stable across builds; never for security. */
#ifndef DT_CORE_HASH_H
#define DT_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t dt_fnv1a64(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static inline uint64_t dt_fnv1a64_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

#endif
