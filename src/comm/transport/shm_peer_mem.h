/*
 * A shared-memory link's mappings of its peer's communication memory
 * (shm_peer_mem.c).
 */
#ifndef DT_SHM_PEER_MEM_H
#define DT_SHM_PEER_MEM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct shm_peer_maps shm_peer_maps;

/* Where [addr, addr + n) of process pid's region id (its descriptor fd
 * there) lies in our mapping of it, mapping it first if need be (*maps
 * is created on first use); NULL when it cannot be mapped. */
const char *shm_peer_mem(shm_peer_maps **maps, pid_t pid, uint32_t id, int fd, uint64_t addr,
                         size_t n);
void shm_peer_mem_release(shm_peer_maps *maps);

#endif
