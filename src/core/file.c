/* Whole-file reads and directory syncs. See file.h. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/str.h"

char *dt_read_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        dt_strf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, used = 0;
    char *buf = malloc(cap + 1);
    for (size_t got; buf && (got = fread(buf + used, 1, cap - used, f)) > 0;) {
        used += got;
        if (used < cap) continue;
        if (cap > max_bytes) break; /* one byte more than allowed was read */
        char *nb = realloc(buf, 2 * cap + 1);
        if (!nb) free(buf);
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f) || !buf;
    fclose(f);
    if (bad || used > max_bytes) {
        dt_strf(err, errlen, "%s: cannot read (unreadable, out of memory or over %zu bytes)",
                path, max_bytes);
        free(buf);
        return NULL;
    }
    buf[used] = 0;
    if (len) *len = used;
    return buf;
}

int dt_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}
