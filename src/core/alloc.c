#include "core/alloc.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Each block carries a header (one alignment unit) recording its size and
 * kind, so dt_free can account without a lookup table. */
typedef struct {
    size_t bytes;
    int kind;
} block_header;

static _Atomic size_t current[DT_MEM_KIND_COUNT];
static _Atomic size_t peak[DT_MEM_KIND_COUNT];

void *dt_alloc(size_t bytes, dt_mem_kind kind)
{
    if ((unsigned)kind >= DT_MEM_KIND_COUNT || bytes > SIZE_MAX - 2 * DT_ALIGN) return NULL;
    size_t total = (bytes + DT_ALIGN + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN;
    char *base = aligned_alloc(DT_ALIGN, total);
    if (!base) return NULL;
    memset(base, 0, total);
    block_header *h = (block_header *)base;
    h->bytes = bytes;
    h->kind = (int)kind;
    dt_mem_account(kind, (long long)bytes);
    return base + DT_ALIGN;
}

void dt_mem_account(dt_mem_kind kind, long long delta)
{
    if (delta < 0) {
        atomic_fetch_sub(&current[kind], (size_t)-delta);
        return;
    }
    size_t now = atomic_fetch_add(&current[kind], (size_t)delta) + (size_t)delta;
    size_t p = atomic_load(&peak[kind]);
    while (now > p && !atomic_compare_exchange_weak(&peak[kind], &p, now)) {
    }
}

void dt_mem_restore_peak(dt_mem_kind kind, size_t bytes)
{
    size_t now = atomic_load(&current[kind]);
    atomic_store(&peak[kind], bytes > now ? bytes : now);
}

void dt_free(void *p)
{
    if (!p) return;
    char *base = (char *)p - DT_ALIGN;
    block_header *h = (block_header *)base;
    atomic_fetch_sub(&current[h->kind], h->bytes);
    free(base);
}

size_t dt_mem_current(dt_mem_kind kind) { return atomic_load(&current[kind]); }
size_t dt_mem_peak(dt_mem_kind kind) { return atomic_load(&peak[kind]); }

const char *dt_mem_kind_name(dt_mem_kind kind)
{
    static const char *names[] = {"params", "grads", "optim", "acts", "comm", "other"};
    return (unsigned)kind < DT_MEM_KIND_COUNT ? names[kind] : "?";
}
