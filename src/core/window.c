#include "core/window.h"

#include <stdint.h>
#include <sys/mman.h>

/* Transparent huge pages: a window is refilled every step, and at 4 KiB
 * a page each refill costs a fault per page (a 124M-parameter model's
 * gathers fault hundreds of thousands of times a step); at 2 MiB, 512
 * times fewer. */
#define HUGE_BYTES ((size_t)2 << 20)

static size_t rounded(size_t bytes)
{
    return bytes ? (bytes + DT_PAGE_BYTES - 1) / DT_PAGE_BYTES * DT_PAGE_BYTES : DT_PAGE_BYTES;
}

void *dt_window_reserve(size_t bytes)
{
    size_t n = rounded(bytes), span = n + HUGE_BYTES;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    /* Keep a huge-page-aligned n bytes of it; give the rest back. */
    char *w = (char *)(((uintptr_t)raw + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    if (w > raw) munmap(raw, (size_t)(w - raw));
    if (raw + span > w + n) munmap(w + n, (size_t)(raw + span - (w + n)));
#ifdef MADV_HUGEPAGE
    madvise(w, n, MADV_HUGEPAGE); /* advice only: without THP the window still works */
#endif
    return w;
}

void dt_window_free(void *w, size_t bytes)
{
    if (w) munmap(w, rounded(bytes));
}

void dt_window_drop(void *w, size_t lo, size_t hi)
{
    size_t a = (lo + DT_PAGE_BYTES - 1) / DT_PAGE_BYTES * DT_PAGE_BYTES;
    size_t b = hi / DT_PAGE_BYTES * DT_PAGE_BYTES;
    /* Private anonymous pages given back read as zeros on the next touch. */
    if (b > a) madvise((char *)w + a, b - a, MADV_DONTNEED);
}
