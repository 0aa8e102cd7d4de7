/* FNV-1a, 64 bits: a fingerprint of a buffer, for checking that ranks hold
 * the same bytes (not for hash tables or security). */
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

#endif
