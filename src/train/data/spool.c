/* See spool.h. */
#include "train/data/spool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/str.h"

/* A file without a name in dir: O_TMPFILE, or where the filesystem lacks
 * it a named one removed at once. */
static int nameless(const char *dir)
{
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) return fd;
    char path[4200];
    dt_strf(path, sizeof path, "%s/.dtrain-tokens.XXXXXX", dir);
    fd = mkostemp(path, O_CLOEXEC);
    if (fd >= 0) unlink(path);
    return fd;
}

int dt_spool_open(dt_spool *s, const char *dir, char *err, size_t errlen)
{
    s->n = 0;
    dt_strf(s->dir, sizeof s->dir, "%s", dir);
    s->fd = nameless(dir);
    if (s->fd >= 0) return 0;
    return dt_strf(err, errlen, "%s: cannot create a scratch file for the tokens: %s", dir,
                   strerror(errno)), -1;
}

int dt_spool_append(dt_spool *s, const uint32_t *ids, size_t n, char *err, size_t errlen)
{
    const char *p = (const char *)ids;
    size_t left = n * sizeof *ids;
    while (left) {
        ssize_t put = write(s->fd, p, left);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0)
            return dt_strf(err, errlen, "%s: writing the tokens' scratch file: %s", s->dir,
                           put < 0 ? strerror(errno) : "no space"), -1;
        p += put;
        left -= (size_t)put;
    }
    s->n += n;
    return 0;
}

int dt_spool_read(const dt_spool *s, uint64_t at, size_t n, uint32_t *out, char *err,
                  size_t errlen)
{
    char *p = (char *)out;
    size_t left = n * sizeof *out;
    off_t off = (off_t)(at * sizeof *out);
    while (left) {
        ssize_t got = pread(s->fd, p, left, off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            return dt_strf(err, errlen, "%s: reading the tokens' scratch file: %s", s->dir,
                           got < 0 ? strerror(errno) : "unexpected end"), -1;
        p += got;
        off += got;
        left -= (size_t)got;
    }
    return 0;
}

void dt_spool_close(dt_spool *s)
{
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}
