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

/* A window whose pages are kept between uses: what dt_window_drop gives
 * back stays with the window's pool, and dt_window_bring maps it under
 * another part, resident, so a part refilled every step (ZeRO-3's gathered
 * layers, ZeRO-2's gradients) costs no page faults and no clearing. The
 * pool holds the most bytes brought at once, in the RSS while idle; where
 * no memfd can be had the window is a plain one. */
void *dt_window_reserve_pooled(size_t bytes);
/* Backs the whole pages inside bytes [lo, hi) of w with pages of its pool,
 * mapped and resident, before the part is written: they read as zeros when
 * `zero` is set, and as whatever they last held otherwise (what the part
 * held before is lost). On a plain window, or when the pool cannot grow,
 * it maps nothing: the part then fills by faults, reading zeros where its
 * pages were dropped. With `zero` the bytes of the part in pages at its
 * edges, which a drop leaves, are cleared too: all of [lo, hi) reads 0. */
void dt_window_bring(void *w, size_t lo, size_t hi, int zero);
/* The bytes of w's pool (0: a plain window). */
size_t dt_window_pooled_bytes(const void *w);
/* The bytes of every pool of the process. */
size_t dt_window_pools_bytes(void);
/* Gives back the pages lying wholly inside bytes [lo, hi) of w; they read
 * as zeros afterwards. Parts of pages at the edges stay. */
void dt_window_drop(void *w, size_t lo, size_t hi);

#endif
