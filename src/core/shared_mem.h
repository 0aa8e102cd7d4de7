/*
 * Shared memory regions (shared_mem.c): memory that local peers can map,
 * under dt_alloc_shared (core/alloc.h) and dt_comm_mem_alloc. The
 * shared-memory transport finds a message's region (dt_shared_find) and
 * maps a peer's by the head page every region starts with.
 */
#ifndef DT_CORE_SHARED_MEM_H
#define DT_CORE_SHARED_MEM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define DT_MEM_MAGIC 0x314d454d54445244ull /* "DRTDMEM1" */

/* The first page of a region, which peers read: the caller's bytes
 * follow it. */
typedef struct {
    uint64_t magic;
    uint64_t id;    /* the owner's number for it, never 0 */
    uint64_t base;  /* the owner's address of the first byte after this page */
    uint64_t offset; /* of the first byte from the start of this page: the page size */
    uint64_t bytes;  /* the caller's */
    _Atomic uint32_t live; /* 0 once the owner has freed it */
} dt_mem_head;

typedef struct {
    uint32_t id;
    int fd; /* the owner's file descriptor of the region */
} dt_mem_ref;

/* A new region of at least bytes, zeroed and page-aligned; NULL where no
 * shared file can be had (errno set). */
void *dt_shared_map(size_t bytes);
/* Frees a region dt_shared_map gave; -1 when p is none. */
int dt_shared_unmap(void *p);
/* 1 and *out when [p, p + n) lies inside one live region of this
 * process, 0 otherwise. */
int dt_shared_find(const void *p, size_t n, dt_mem_ref *out);
/* Peers' regions this process maps (+bytes when mapped, -bytes when let
 * go), and the most it ever mapped: pages the RSS counts that are the
 * peers' memory, not more of it. */
void dt_shared_peer_mapped(long long delta);
size_t dt_shared_peer_peak(void);

#endif
