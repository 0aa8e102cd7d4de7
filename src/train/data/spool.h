/* Tokens set aside on disk until their count is known: `dtrain data
 * prepare` cuts its validation part from the end, so a text's tokens are
 * all written here first, then copied into the shards. The file has no
 * name (it is gone when closed, or when the process dies) and lies in the
 * output directory, on the disk the shards go to, not in memory. */
#ifndef DT_TRAIN_DATA_SPOOL_H
#define DT_TRAIN_DATA_SPOOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int fd;
    uint64_t n; /* tokens written */
    char dir[4096];
} dt_spool;

int dt_spool_open(dt_spool *s, const char *dir, char *err, size_t errlen);
int dt_spool_append(dt_spool *s, const uint32_t *ids, size_t n, char *err, size_t errlen);
/* Tokens at .. at+n-1. */
int dt_spool_read(const dt_spool *s, uint64_t at, size_t n, uint32_t *out, char *err,
                  size_t errlen);
void dt_spool_close(dt_spool *s);

#endif
