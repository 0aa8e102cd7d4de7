/* Address space reserved whole, memory held only where written: a buffer as
 * large as the model whose pages come and go as a strategy uses its parts
 * (ZeRO's gathered parameters and gradient windows). Pages not yet written,
 * and pages dropped, read as zeros. The bytes in use are accounted by the
 * caller (dt_mem_account), which knows which parts it holds. */
#ifndef DT_CORE_WINDOW_H
#define DT_CORE_WINDOW_H

#include <stddef.h>

#define DT_PAGE_BYTES 4096

/* A zeroed, page-aligned window of `bytes`; NULL when the address space is
 * refused. Nothing is resident until written. */
void *dt_window_reserve(size_t bytes);
void dt_window_free(void *w, size_t bytes);
/* Gives back the pages lying wholly inside bytes [lo, hi) of w; they read
 * as zeros afterwards. Parts of pages at the edges stay. */
void dt_window_drop(void *w, size_t lo, size_t hi);

#endif
