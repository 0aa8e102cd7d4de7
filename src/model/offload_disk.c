/* The disk under --nvme-path: files that no name leads to, O_DIRECT where
 * it is had, the space free, and the start-up bandwidth probe. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_DIRECT, O_TMPFILE */
#endif
#include "model/offload.h"
#include "model/offload_disk.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/aio.h"
#include "core/atomic_file.h"
#include "core/str.h"
#include "core/timer.h"

#define IO_ALIGN 4096

/* O_DIRECT on fd where the file system has it (older kernels' tmpfs has
 * not: then buffered, *direct 0). */
void dt_offload_try_direct(int fd, int *direct)
{
    int fl = fcntl(fd, F_GETFL);
    *direct = fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
}

/* A new file in dir that no name leads to, so that nothing outlives the
 * process however it ends (a killed rank left gigabytes, and a restart
 * with the same PID, as in a container, failed on the old name):
 * O_TMPFILE, or where the file system has none (NFS, FUSE), a file made
 * under a unique name from `stem` and unlinked at once. The descriptor,
 * or -1 with errno. */
int dt_offload_open_unnamed(const char *dir, const char *stem)
{
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EOPNOTSUPP && errno != EISDIR) return -1;
    if (fd < 0) {
        char path[DT_PATH_MAX];
        if (dt_strf(path, sizeof path, "%s/%s-XXXXXX", dir, stem) >= (int)sizeof path)
            return errno = ENAMETOOLONG, -1;
        if ((fd = mkostemp(path, O_CLOEXEC)) < 0) return -1;
        if (unlink(path)) {
            int e = errno;
            close(fd);
            return errno = e, -1;
        }
    }
    return fd;
}

/* The bytes free to this user on the file system under dir, or
 * UINT64_MAX where it cannot say. */
uint64_t dt_offload_free_bytes(const char *dir)
{
    struct statvfs v;
    return statvfs(dir, &v) ? UINT64_MAX : (uint64_t)v.f_bavail * v.f_frsize;
}

/* Sequential bytes through one engine: `total` in blocks of `len` from
 * buf, all queued at once (the engine keeps its depth in flight). */
static int sweep(dt_aio *a, int fd, const char *path, int write, void *buf, size_t len,
                 size_t total)
{
    for (size_t off = 0; off < total; off += len) {
        int t = write ? dt_aio_write(a, fd, path, buf, len, off)
                      : dt_aio_read(a, fd, path, buf, len, off);
        if (t < 0) return -1;
    }
    return dt_aio_drain(a);
}

/* The probe's size: at most `most`, and at most half what the file
 * system has free (the run's own files are made already; the other half
 * is left to whatever else writes there), in whole writes; 0 where that
 * is under PROBE_MIN, too little to say anything about the disk. */
#define PROBE_WRITE ((size_t)4 << 20)
#define PROBE_MIN ((size_t)16 << 20)
static size_t probe_bytes(size_t most, uint64_t avail)
{
    uint64_t b = most;
    if (avail / 2 < b) b = avail / 2;
    b = b / PROBE_WRITE * PROBE_WRITE;
    return b < PROBE_MIN ? 0 : (size_t)b;
}

/* Writes p->bytes sequentially (then fsync), drops them from the page
 * cache and reads them back, timing both. */
static int probe_file(int fd, const char *path, dt_disk_probe *p, char *err, size_t errlen)
{
    void *buf = NULL;
    dt_aio *a = NULL;
    if (posix_memalign(&buf, IO_ALIGN, PROBE_WRITE))
        return dt_strf(err, errlen, "measuring the disk: out of memory"), -1;
    memset(buf, 0x5a, PROBE_WRITE);
    int rc = dt_aio_open(&a, 8, 1u << 20, err, errlen);
    uint64_t t0 = dt_now_ns();
    if (rc == 0 && sweep(a, fd, path, 1, buf, PROBE_WRITE, p->bytes)) rc = -1;
    if (rc == 0 && fsync(fd)) {
        dt_strf(err, errlen, "measuring the disk: fsync of %s: %s", path, strerror(errno));
        rc = -2; /* err says it, not the engine */
    }
    uint64_t t1 = dt_now_ns();
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (rc == 0 && sweep(a, fd, path, 0, buf, PROBE_WRITE, p->bytes)) rc = -1;
    uint64_t t2 = dt_now_ns();
    if (rc == -1 && a) dt_strf(err, errlen, "measuring the disk: %s", dt_aio_error(a));
    p->write_bps = (double)p->bytes / ((double)(t1 - t0) * 1e-9);
    p->read_bps = (double)p->bytes / ((double)(t2 - t1) * 1e-9);
    dt_aio_close(a);
    free(buf);
    return rc ? -1 : 0;
}

int dt_disk_bandwidth(const char *dir, size_t most, dt_disk_probe *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->free = dt_offload_free_bytes(dir);
    if (!(p->bytes = probe_bytes(most, p->free))) return 0;
    char path[DT_PATH_MAX];
    dt_strf(path, sizeof path, "an unnamed file in %s", dir);
    int fd = dt_offload_open_unnamed(dir, "dtrain-probe");
    if (fd < 0)
        return dt_strf(err, errlen, "--nvme-path %s: cannot create a file in it: %s", dir,
                       strerror(errno)), -1;
    dt_offload_try_direct(fd, &p->direct);
    int rc = probe_file(fd, path, p, err, errlen);
    close(fd);
    return rc;
}
