#include "core/alloc.h"
#include "core/shared_mem.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Each block carries a header (one alignment unit) recording its size and
 * kind, so dt_free can account without a lookup table. */
enum { IN_HEAP, ANON_MAPPING, SHARED_REGION }; /* where a block lives */

typedef struct {
    size_t bytes;
    int kind, where;
} block_header;

/* Large blocks come zeroed and in place from the kernel in one call (a
 * mapping populated up front), not page by page on the first write: a
 * restarted rank allocates its whole state at once, and half a million
 * page faults took most of its load time. */
#define MAP_FROM ((size_t)8 << 20)

static dt_mem_counter held[DT_MEM_KIND_COUNT];

/* The header at base filled in and the bytes counted: the caller's block. */
static void *account_block(char *base, size_t bytes, dt_mem_kind kind, int where)
{
    block_header *h = (block_header *)base;
    h->bytes = bytes;
    h->kind = (int)kind;
    h->where = where;
    dt_mem_account(kind, (long long)bytes);
    return base + DT_ALIGN;
}

void *dt_alloc(size_t bytes, dt_mem_kind kind)
{
    if ((unsigned)kind >= DT_MEM_KIND_COUNT || bytes > SIZE_MAX - 2 * DT_ALIGN) return NULL;
    size_t total = (bytes + DT_ALIGN + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN;
    char *base;
    const int mapped = total >= MAP_FROM;
    if (mapped) {
        base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                    -1, 0);
        if (base == MAP_FAILED) return NULL;
    } else {
        if (!(base = aligned_alloc(DT_ALIGN, total))) return NULL;
        memset(base, 0, total);
    }
    return account_block(base, bytes, kind, mapped ? ANON_MAPPING : IN_HEAP);
}

#if defined(__SANITIZE_ADDRESS__)
#define DT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DT_ASAN 1
#endif
#endif

/* A shared region's block: the same header, inside the region. */
void *dt_alloc_region(size_t bytes, dt_mem_kind kind)
{
    if ((unsigned)kind >= DT_MEM_KIND_COUNT || bytes > SIZE_MAX - 2 * DT_ALIGN) return NULL;
    char *base = dt_shared_map(bytes + DT_ALIGN);
    if (!base) return dt_alloc(bytes, kind); /* no shared file here: plain memory */
    return account_block(base, bytes, kind, SHARED_REGION);
}

/* Under AddressSanitizer the model's buffers stay in the heap, where its
 * redzones catch an overrun that a mapping would hide; the comm tests
 * still run the regions (dt_alloc_region). */
void *dt_alloc_shared(size_t bytes, dt_mem_kind kind)
{
#ifdef DT_ASAN
    return dt_alloc(bytes, kind);
#else
    return dt_alloc_region(bytes, kind);
#endif
}

void dt_mem_counter_add(dt_mem_counter *c, long long delta)
{
    if (delta < 0) {
        atomic_fetch_sub(&c->now, (size_t)-delta);
        return;
    }
    size_t now = atomic_fetch_add(&c->now, (size_t)delta) + (size_t)delta;
    size_t p = atomic_load(&c->peak);
    while (now > p && !atomic_compare_exchange_weak(&c->peak, &p, now)) {
    }
}

void dt_mem_account(dt_mem_kind kind, long long delta) { dt_mem_counter_add(&held[kind], delta); }

void dt_mem_restore_peak(dt_mem_kind kind, size_t bytes)
{
    size_t now = atomic_load(&held[kind].now);
    atomic_store(&held[kind].peak, bytes > now ? bytes : now);
}

void dt_free(void *p)
{
    if (!p) return;
    char *base = (char *)p - DT_ALIGN;
    block_header *h = (block_header *)base;
    atomic_fetch_sub(&held[h->kind].now, h->bytes);
    if (h->where == SHARED_REGION)
        dt_shared_unmap(base);
    else if (h->where == ANON_MAPPING)
        munmap(base, (h->bytes + DT_ALIGN + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN);
    else
        free(base);
}

size_t dt_mem_current(dt_mem_kind kind) { return atomic_load(&held[kind].now); }
size_t dt_mem_peak(dt_mem_kind kind) { return atomic_load(&held[kind].peak); }

const char *dt_mem_kind_name(dt_mem_kind kind)
{
    static const char *names[] = {"params", "grads", "optim", "acts", "comm", "other"};
    return (unsigned)kind < DT_MEM_KIND_COUNT ? names[kind] : "?";
}
