#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include "core/window.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Transparent huge pages: a plain window is refilled every step, and at
 * 4 KiB a page each refill costs a fault per page (a 124M-parameter
 * model's gathers fault hundreds of thousands of times a step); at 2 MiB,
 * 512 times fewer. */
#define HUGE_BYTES ((size_t)2 << 20)

static size_t rounded(size_t bytes)
{
    return bytes ? (bytes + DT_PAGE_BYTES - 1) / DT_PAGE_BYTES * DT_PAGE_BYTES : DT_PAGE_BYTES;
}

static size_t page_down(size_t x) { return x / DT_PAGE_BYTES * DT_PAGE_BYTES; }
static size_t page_up(size_t x) { return page_down(x + DT_PAGE_BYTES - 1); }

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

/* ---- pooled windows ------------------------------------------------------
 * A pool is a memfd cut into slots. A part brought in gets a free slot (or
 * a new one at the end of the file) mapped over it with MAP_POPULATE; a
 * part dropped gets a fresh anonymous mapping, and its slot, still holding
 * its pages, goes back to the free ones. The pools live in a small table
 * keyed by the window's address, so that every dt_window_drop, from
 * whichever layer, gives pooled pages back rather than letting a stale
 * shared page show through where zeros are promised. */

#define MAX_POOLS 16

typedef struct {
    size_t off, len; /* bytes of the memfd */
    char *at;        /* where it is mapped (its first `used` bytes); NULL: free */
    size_t used;
    int retired; /* partly remapped by a drop that cut it: never handed out again */
} slot;

typedef struct {
    char *base;
    size_t bytes;
    int fd;
    size_t fd_bytes;
    slot *s;
    int n, cap;
} pool;

static pool pools[MAX_POOLS];
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;

static pool *pool_of(const void *w)
{
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].base && (const char *)w >= pools[i].base &&
            (const char *)w < pools[i].base + pools[i].bytes)
            return &pools[i];
    return NULL;
}

void *dt_window_reserve_pooled(size_t bytes)
{
    char *w = dt_window_reserve(bytes);
    if (!w) return NULL;
    int fd = memfd_create("dtrain-window", MFD_CLOEXEC);
    if (fd < 0) return w; /* a plain window: correct, only slower */
    pthread_mutex_lock(&pools_lock);
    pool *p = NULL;
    for (int i = 0; i < MAX_POOLS && !p; i++)
        if (!pools[i].base) p = &pools[i];
    if (p) *p = (pool){.base = w, .bytes = rounded(bytes), .fd = fd};
    pthread_mutex_unlock(&pools_lock);
    if (!p) close(fd);
    return w;
}

/* Fresh zero pages, held nowhere until touched, over [at, at + n). */
static int anonymous(char *at, size_t n)
{
    return mmap(at, n, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED
               ? -1
               : 0;
}

/* Gives back the slots mapped inside [a, b); a slot that only overlaps
 * is retired, its pages aliased nowhere again. Should the fresh mapping be
 * refused (the kernel's map count), the range keeps its slots' pages,
 * zeroed, and they are retired too: never handed to another part. */
static void pool_drop(pool *p, char *a, char *b)
{
    int remapped = anonymous(a, (size_t)(b - a)) == 0;
    if (!remapped) memset(a, 0, (size_t)(b - a));
    for (int i = 0; i < p->n; i++) {
        slot *s = &p->s[i];
        if (!s->at || s->at >= b || s->at + s->used <= a) continue;
        if (!remapped || s->at < a || s->at + s->used > b) s->retired = 1;
        s->at = NULL;
    }
}

/* The smallest free slot of at least n bytes and at most a quarter more
 * (a layer's slot is not spent on a small part, nor a large part's on a
 * layer: each size keeps its own); else a new one. -1: no memory. */
static int pool_slot(pool *p, size_t n)
{
    int best = -1;
    for (int i = 0; i < p->n; i++) {
        slot *s = &p->s[i];
        if (s->at || s->retired || s->len < n || s->len > n + n / 4) continue;
        if (best < 0 || s->len < p->s[best].len) best = i;
    }
    if (best >= 0) return best;
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        slot *s = realloc(p->s, (size_t)cap * sizeof *s);
        if (!s) return -1;
        p->s = s;
        p->cap = cap;
    }
    if (ftruncate(p->fd, (off_t)(p->fd_bytes + n)) != 0) return -1;
    p->s[p->n] = (slot){.off = p->fd_bytes, .len = n};
    p->fd_bytes += n;
    return p->n++;
}

static void pool_bring(pool *p, char *a, char *b, int zero)
{
    size_t n = (size_t)(b - a);
    for (int i = 0; i < p->n; i++)
        if (p->s[i].at == a && p->s[i].used == n) return; /* already here */
    pool_drop(p, a, b);
    int k = pool_slot(p, n);
    if (k < 0) return; /* the anonymous pages stay: they fill by faults */
    slot *s = &p->s[k];
    if (mmap(a, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, p->fd,
             (off_t)s->off) == MAP_FAILED) {
        anonymous(a, n); /* a failed MAP_FIXED may have unmapped the part */
        return;
    }
    s->at = a;
    s->used = n;
    if (zero) memset(a, 0, n);
}

void dt_window_bring(void *w, size_t lo, size_t hi, int zero)
{
    size_t a = page_up(lo), b = page_down(hi);
    if (b > a) {
        pthread_mutex_lock(&pools_lock);
        pool *p = pool_of(w);
        if (p) pool_bring(p, (char *)w + a, (char *)w + b, zero);
        pthread_mutex_unlock(&pools_lock);
    } else {
        a = b = hi; /* no whole page inside: all of the part is edge */
    }
    /* The parts of pages at the edges were never given back: they hold
     * what this part (or a use before) last wrote. */
    if (zero && hi > lo) {
        memset((char *)w + lo, 0, a - lo);
        memset((char *)w + b, 0, hi - b);
    }
}

size_t dt_window_pools_bytes(void)
{
    size_t n = 0;
    pthread_mutex_lock(&pools_lock);
    for (int i = 0; i < MAX_POOLS; i++) n += pools[i].fd_bytes;
    pthread_mutex_unlock(&pools_lock);
    return n;
}

size_t dt_window_pooled_bytes(const void *w)
{
    pthread_mutex_lock(&pools_lock);
    const pool *p = pool_of(w);
    size_t n = p ? p->fd_bytes : 0;
    pthread_mutex_unlock(&pools_lock);
    return n;
}

/* ---- plain and pooled ----------------------------------------------------- */

void dt_window_free(void *w, size_t bytes)
{
    if (!w) return;
    pthread_mutex_lock(&pools_lock);
    pool *p = pool_of(w);
    if (p) {
        close(p->fd);
        free(p->s);
        *p = (pool){0};
    }
    pthread_mutex_unlock(&pools_lock);
    munmap(w, rounded(bytes));
}

void dt_window_drop(void *w, size_t lo, size_t hi)
{
    size_t a = page_up(lo), b = page_down(hi);
    if (b <= a) return;
    pthread_mutex_lock(&pools_lock);
    pool *p = pool_of(w);
    if (p) pool_drop(p, (char *)w + a, (char *)w + b);
    pthread_mutex_unlock(&pools_lock);
    /* Private anonymous pages given back read as zeros on the next touch. */
    if (!p) madvise((char *)w + a, b - a, MADV_DONTNEED);
}
