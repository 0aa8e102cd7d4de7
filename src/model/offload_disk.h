/* The disk under --nvme-path, for the offload store (offload.c) and its
 * start-up probe (dt_disk_bandwidth, declared in offload.h). */
#ifndef DT_MODEL_OFFLOAD_DISK_H
#define DT_MODEL_OFFLOAD_DISK_H

#include <stdint.h>

/* O_DIRECT on fd where the file system has it; *direct says whether. */
void dt_offload_try_direct(int fd, int *direct);
/* A new file in dir that no name leads to (O_TMPFILE, or a unique name
 * from `stem` unlinked at once): the descriptor, or -1 with errno. */
int dt_offload_open_unnamed(const char *dir, const char *stem);
/* The bytes free to this user under dir, or UINT64_MAX where unknown. */
uint64_t dt_offload_free_bytes(const char *dir);

#endif
