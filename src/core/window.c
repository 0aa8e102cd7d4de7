#include "core/window.h"

#include <stdint.h>
#include <sys/mman.h>

void *dt_window_reserve(size_t bytes)
{
    if (bytes == 0) bytes = DT_PAGE_BYTES;
    void *w = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return w == MAP_FAILED ? NULL : w;
}

void dt_window_free(void *w, size_t bytes)
{
    if (w) munmap(w, bytes ? bytes : DT_PAGE_BYTES);
}

void dt_window_drop(void *w, size_t lo, size_t hi)
{
    size_t a = (lo + DT_PAGE_BYTES - 1) / DT_PAGE_BYTES * DT_PAGE_BYTES;
    size_t b = hi / DT_PAGE_BYTES * DT_PAGE_BYTES;
    /* Private anonymous pages given back read as zeros on the next touch. */
    if (b > a) madvise((char *)w + a, b - a, MADV_DONTNEED);
}
