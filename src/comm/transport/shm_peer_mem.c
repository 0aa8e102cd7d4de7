/*
 * A receiver's mappings of its peer's communication memory (memory.c).
 *
 * A message sent from such memory names the sender's region (its number
 * and its file descriptor) and the payload's address in the sender. The
 * first time a link meets a region, it takes a copy of the sender's file
 * descriptor (pidfd_getfd: the same permission cross-memory attach needs)
 * and maps the file read-only, page tables filled at once; later messages
 * from the region cost a lookup. The head page tells the sender's address
 * of the region, so the payload's place in the mapping is its offset from
 * there, checked against the region's size.
 *
 * Mappings belong to the link, so they live no longer than the
 * communicator and never outlive their peer's process. A region the
 * sender has freed is unmapped at the link's next new mapping (a freed
 * region has no message in flight: freeing one that has is the caller's
 * error). Anything that fails returns NULL and the message is pulled by
 * cross-memory attach instead; after a refused descriptor the link stops
 * asking (DTRAIN_SHM_MAP=0 has the link never ask: shm.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/shared_mem.h"
#include "comm/transport/shm_peer_mem.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

typedef struct {
    uint32_t id;
    const dt_mem_head *head; /* the mapping starts with it */
    size_t map_bytes;
} peer_region;

struct shm_peer_maps {
    int refused; /* the peer's descriptors cannot be had: stop asking */
    int n, cap;
    peer_region *r;
};

static void unmap(const peer_region *r)
{
    munmap((void *)r->head, r->map_bytes);
    dt_shared_peer_mapped(-(long long)r->map_bytes);
}

static void unmap_freed(shm_peer_maps *m)
{
    for (int i = 0; i < m->n;) {
        if (atomic_load_explicit(&m->r[i].head->live, memory_order_acquire)) {
            i++;
            continue;
        }
        unmap(&m->r[i]);
        m->r[i] = m->r[--m->n];
    }
}

/* The peer's region fd, mapped; NULL when it cannot be. */
static const dt_mem_head *map_peer(pid_t pid, int fd, size_t *map_bytes)
{
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) return NULL;
    int mine = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    close(pidfd);
    if (mine < 0) return NULL;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(mine, &st) == 0 && st.st_size >= (off_t)sizeof(dt_mem_head))
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED | MAP_POPULATE, mine, 0);
    close(mine);
    if (p == MAP_FAILED) return NULL;
    *map_bytes = (size_t)st.st_size;
    return p;
}

static const peer_region *add_region(shm_peer_maps *m, pid_t pid, uint32_t id, int fd)
{
    unmap_freed(m);
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 8;
        peer_region *more = realloc(m->r, (size_t)cap * sizeof *more);
        if (!more) return NULL;
        m->r = more, m->cap = cap;
    }
    size_t map_bytes = 0;
    const dt_mem_head *h = map_peer(pid, fd, &map_bytes);
    if (!h) {
        m->refused = errno == EPERM || errno == ENOSYS;
        return NULL;
    }
    /* The descriptor must still be the region the message named. */
    if (h->magic != DT_MEM_MAGIC || h->id != id || h->offset < sizeof *h ||
        h->offset > map_bytes || h->bytes > map_bytes - h->offset ||
        !atomic_load_explicit(&h->live, memory_order_acquire)) {
        munmap((void *)h, map_bytes);
        return NULL;
    }
    m->r[m->n] = (peer_region){id, h, map_bytes};
    dt_shared_peer_mapped((long long)map_bytes);
    return &m->r[m->n++];
}

const char *shm_peer_mem(shm_peer_maps **maps, pid_t pid, uint32_t id, int fd, uint64_t addr,
                         size_t n)
{
    if (!*maps && !(*maps = calloc(1, sizeof **maps))) return NULL;
    shm_peer_maps *m = *maps;
    const peer_region *r = NULL;
    for (int i = 0; i < m->n && !r; i++)
        if (m->r[i].id == id) r = &m->r[i];
    if (!r && (m->refused || !(r = add_region(m, pid, id, fd)))) return NULL;
    const dt_mem_head *h = r->head;
    if (addr < h->base || n > h->bytes || addr - h->base > h->bytes - n) return NULL;
    return (const char *)h + h->offset + (addr - h->base);
}

void shm_peer_mem_release(shm_peer_maps *m)
{
    if (!m) return;
    for (int i = 0; i < m->n; i++) unmap(&m->r[i]);
    free(m->r);
    free(m);
}
