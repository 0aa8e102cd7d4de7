/*
 * Shared memory regions: the memory under dt_alloc_shared and the public
 * dt_comm_mem_alloc, buffers that ranks on the same host read from each
 * other without the kernel, the field's registered or symmetric memory
 * (NCCL's ncclMemAlloc, PyTorch's symmetric memory).
 *
 * A large message from ordinary memory is pulled by cross-memory attach:
 * a system call that pins the sender's pages and copies them, at about
 * two thirds of a user copy's speed on the Xeons seen here, so that a
 * two-rank all-to-all-v moved no faster than Open MPI's, which pulls the
 * same way. A buffer from here is an anonymous shared file (memfd): a
 * peer maps it once (comm/transport/shm_peer_mem.c) and from then on copies or reduces
 * straight out of it at user-copy speed, with no system call and no
 * pinning.
 *
 * Each region starts with one page the peers read too (dt_mem_head): the
 * region's number, the owner's address of its first byte, and whether it
 * is still allocated, so that a peer's mapping of a freed region is let
 * go at its next new mapping. The caller gets the page-aligned bytes after
 * it. A child of fork() does not inherit the mapping (MADV_DONTFORK):
 * it would share the pages with its parent.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/shared_mem.h"

/* The head says the rest: number, the first byte handed out, its size. */
typedef struct {
    dt_mem_head *head;
    size_t map_bytes; /* head page + bytes, rounded to pages */
    int fd;
} region;

static char *user_of(const region *r) { return (char *)r->head + r->head->offset; }

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dt_mem_counter peers; /* bytes of peers' regions we map */
static region *regions;
static int n_regions, cap_regions;
static uint32_t next_id;

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static int remember(const region *r)
{
    if (n_regions == cap_regions) {
        int cap = cap_regions ? 2 * cap_regions : 16;
        region *more = realloc(regions, (size_t)cap * sizeof *more);
        if (!more) return -1;
        regions = more, cap_regions = cap;
    }
    regions[n_regions++] = *r;
    return 0;
}

/* A shared region of at least bytes (its head not yet written), or -1
 * (errno set). */
static int map_region(size_t bytes, region *r)
{
    const size_t page = page_size();
    if (bytes > SIZE_MAX - 2 * page) return errno = ENOMEM, -1;
    r->map_bytes = (bytes + page - 1) / page * page + page;
    r->fd = memfd_create("dtrain-comm-mem", MFD_CLOEXEC);
    if (r->fd < 0) return -1;
    void *p = MAP_FAILED;
    if (ftruncate(r->fd, (off_t)r->map_bytes) == 0)
        p = mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(r->fd);
        return errno = e, -1;
    }
    r->head = p;
    return 0;
}

void *dt_shared_map(size_t bytes)
{
    if (bytes == 0) bytes = 1;
    region r;
    if (map_region(bytes, &r) < 0) return NULL;
    madvise(r.head, r.map_bytes, MADV_DONTFORK);
    const size_t page = page_size();
    pthread_mutex_lock(&lock);
    uint32_t id = ++next_id ? next_id : ++next_id; /* 0 never names a region */
    *r.head = (dt_mem_head){.magic = DT_MEM_MAGIC, .id = id,
                            .base = (uint64_t)(uintptr_t)((char *)r.head + page),
                            .offset = page, .bytes = bytes};
    atomic_store_explicit(&r.head->live, 1, memory_order_release);
    int bad = remember(&r);
    pthread_mutex_unlock(&lock);
    if (bad) {
        munmap(r.head, r.map_bytes);
        close(r.fd);
        return NULL;
    }
    return user_of(&r);
}

int dt_shared_unmap(void *p)
{
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < n_regions && user_of(&regions[i]) != p) i++;
    region r = i < n_regions ? regions[i] : (region){0};
    if (i < n_regions) regions[i] = regions[--n_regions];
    pthread_mutex_unlock(&lock);
    if (!r.head) return -1;
    /* Peers still mapping it see it gone, and unmap it at their next new
     * mapping; the memory itself goes when the last mapping does. */
    atomic_store_explicit(&r.head->live, 0, memory_order_release);
    munmap(r.head, r.map_bytes);
    close(r.fd);
    return 0;
}

int dt_shared_find(const void *p, size_t n, dt_mem_ref *out)
{
    const char *a = p;
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_regions && !found; i++) {
        const region *r = &regions[i];
        const char *user = user_of(r);
        const size_t bytes = r->head->bytes;
        if (a >= user && n <= bytes && (size_t)(a - user) <= bytes - n) {
            *out = (dt_mem_ref){.id = (uint32_t)r->head->id, .fd = r->fd};
            found = 1;
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

void dt_shared_peer_mapped(long long delta) { dt_mem_counter_add(&peers, delta); }

size_t dt_shared_peer_peak(void) { return atomic_load(&peers.peak); }
