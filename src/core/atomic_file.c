#include "core/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "core/str.h"

/* Threads of one process may write the same path (a rank per thread), so
 * the pid alone does not make the temporary name unique. */
static atomic_uint tmp_counter;

/* A device or a FIFO, opened as it is: no truncation (a device has no
 * length), no creation. Opened without blocking, so that a FIFO nobody
 * reads is an error rather than a wait without end; the writes block. */
static int open_in_place(dt_afile *a, char *err, size_t errlen)
{
    a->in_place = 1;
    a->tmp[0] = '\0';
    a->fd = open(a->path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (a->fd < 0 && errno == ENXIO)
        return dt_strf(err, errlen, "%s: a FIFO that no process reads; start its reader first",
                       a->path),
               -1;
    if (a->fd < 0)
        return dt_strf(err, errlen, "%s: cannot open: %s", a->path, strerror(errno)), -1;
    struct stat st;
    if (fstat(a->fd, &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) &&
        fcntl(a->fd, F_SETFL, fcntl(a->fd, F_GETFL) & ~O_NONBLOCK) == 0)
        return 0;
    dt_strf(err, errlen, "%s: replaced while it was opened; not writing it", a->path);
    close(a->fd);
    a->fd = -1;
    return -1;
}

int dt_afile_open(dt_afile *a, const char *path, char *err, size_t errlen)
{
    a->fd = -1;
    a->in_place = 0;
    dt_out_kind kind;
    if (dt_output_target(path, a->path, sizeof a->path, &kind, err, errlen) != 0) return -1;
    if (kind == DT_OUT_STREAM) return open_in_place(a, err, errlen);
    unsigned n = atomic_fetch_add(&tmp_counter, 1);
    dt_strf(a->tmp, sizeof a->tmp, "%s.tmp.%ld.%u", a->path, (long)getpid(), n);
    a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (a->fd < 0) {
        dt_strf(err, errlen, "%s: cannot create: %s", a->tmp, strerror(errno));
        return -1;
    }
    return 0;
}

/* The name a write failure is reported under. */
static const char *written(const dt_afile *a) { return a->in_place ? a->path : a->tmp; }

static int write_all(int fd, const char *p, size_t n, uint64_t off, int positioned)
{
    while (n) {
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t w = positioned ? pwrite(fd, p, chunk, (off_t)off) : write(fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

int dt_afile_write(dt_afile *a, const void *p, size_t n, char *err, size_t errlen)
{
    if (write_all(a->fd, p, n, 0, 0) == 0) return 0;
    dt_strf(err, errlen, "%s: write failed: %s", written(a), strerror(errno));
    dt_afile_abort(a);
    return -1;
}

int dt_afile_pwrite(dt_afile *a, uint64_t off, const void *p, size_t n, char *err,
                    size_t errlen)
{
    if (write_all(a->fd, p, n, off, 1) == 0) return 0;
    if (errno == ESPIPE)
        dt_strf(err, errlen,
                "%s: a FIFO, and this file is written out of order; give a regular file",
                a->path);
    else
        dt_strf(err, errlen, "%s: write failed: %s", written(a), strerror(errno));
    dt_afile_abort(a);
    return -1;
}

/* The rename is only durable once the directory entry is on disk. */
static int fsync_parent(const char *path)
{
    char dir[DT_PATH_MAX];
    dt_dir_of(path, dir, sizeof dir);
    return dt_fsync_dir(dir);
}

/* A device keeps what it was given; only its close can still fail. */
static int commit_in_place(dt_afile *a, char *err, size_t errlen)
{
    int rc = close(a->fd);
    a->fd = -1;
    if (rc == 0) return 0;
    dt_strf(err, errlen, "%s: close failed: %s", a->path, strerror(errno));
    return -1;
}

int dt_afile_commit(dt_afile *a, char *err, size_t errlen)
{
    if (a->in_place) return commit_in_place(a, err, errlen);
    if (fsync(a->fd) != 0) {
        dt_strf(err, errlen, "%s: fsync failed: %s", a->tmp, strerror(errno));
        dt_afile_abort(a);
        return -1;
    }
    int rc = close(a->fd);
    a->fd = -1;
    if (rc != 0) {
        dt_strf(err, errlen, "%s: close failed: %s", a->tmp, strerror(errno));
        unlink(a->tmp);
        return -1;
    }
    if (rename(a->tmp, a->path) != 0) {
        dt_strf(err, errlen, "%s: cannot rename to %s: %s", a->tmp, a->path, strerror(errno));
        unlink(a->tmp);
        return -1;
    }
    if (fsync_parent(a->path) != 0) {
        dt_strf(err, errlen, "%s: cannot flush its directory: %s", a->path, strerror(errno));
        return -1;
    }
    return 0;
}

void dt_afile_abort(dt_afile *a)
{
    if (a->fd < 0) return;
    close(a->fd);
    a->fd = -1;
    if (!a->in_place) unlink(a->tmp);
}

int dt_afile_write_file(const char *path, const void *p, size_t n, char *err, size_t errlen)
{
    dt_afile a;
    if (dt_afile_open(&a, path, err, errlen) != 0) return -1;
    if (dt_afile_write(&a, p, n, err, errlen) != 0) return -1;
    return dt_afile_commit(&a, err, errlen);
}

int dt_mkdir_p(const char *dir, char *err, size_t errlen)
{
    char buf[DT_PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof buf) {
        dt_strf(err, errlen, "'%.64s': not a usable directory name", dir);
        return -1;
    }
    memcpy(buf, dir, n + 1);
    /* Each prefix that ends at a '/', then the whole path. */
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
            dt_strf(err, errlen, "%s: cannot create directory: %s", buf, strerror(errno));
            return -1;
        }
        buf[i] = saved;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        dt_strf(err, errlen, "%s: not a directory", dir);
        return -1;
    }
    return 0;
}
