/*
 * Communication memory's internals (memory.c): what the shared-memory
 * transport needs to send from it (dt_comm_mem_find) and to map a peer's
 * (the head page every region starts with).
 */
#ifndef DT_COMM_MEMORY_H
#define DT_COMM_MEMORY_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"

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

/* 1 and *out when [p, p + n) lies inside one live region of this
 * process, 0 otherwise. */
int dt_comm_mem_find(const void *p, size_t n, dt_mem_ref *out);

#endif
