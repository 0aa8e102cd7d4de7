/* The output directory's lock. See ckpt/lock.h. */
#include "train/ckpt/lock.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/str.h"

/* What the holder wrote about itself, for the message: "pid N on HOST". */
static void read_holder(int fd, char *buf, size_t len)
{
    ssize_t n = pread(fd, buf, len - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    if (!buf[0]) dt_strf(buf, len, "a process that has not said which yet");
}

static void write_holder(int fd)
{
    char host[256] = "?", line[320];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    dt_strf(line, sizeof line, "pid %ld on %s\n", (long)getpid(), host);
    /* Only a later run's message reads this text; the lock does not
     * depend on it, so a failure to write it is no failure. */
    if (ftruncate(fd, 0) != 0) return;
    ssize_t written = pwrite(fd, line, strlen(line), 0);
    (void)written;
}

/* Never waits: a run holds its lock for hours. */
static int lock_fd(int fd, int op)
{
    int rc;
    while ((rc = flock(fd, op | LOCK_NB)) != 0 && errno == EINTR) continue;
    return rc;
}

/* Why fd's lock is not to be had, and what to do about it. */
static void lock_failed(const char *out_dir, const char *path, int fd, const char *advice,
                        char *err, size_t errlen)
{
    if (errno == EWOULDBLOCK) {
        char holder[320];
        read_holder(fd, holder, sizeof holder);
        dt_strf(err, errlen, "%s is in use by another dtrain run (%s): %s", out_dir, holder,
                advice);
    } else {
        dt_strf(err, errlen, "%s: cannot lock: %s", path, strerror(errno));
    }
}

int dt_ckpt_lock(const char *out_dir, char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 16];
    if (dt_mkdir_p(out_dir, err, errlen) != 0) return -1;
    dt_strf(path, sizeof path, "%s/.lock", out_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        dt_strf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    if (lock_fd(fd, LOCK_EX) == 0) {
        write_holder(fd);
        return fd;
    }
    lock_failed(out_dir, path, fd, "wait for it to finish, or choose another --out", err,
                errlen);
    close(fd);
    return -1;
}

int dt_ckpt_lock_shared(const char *out_dir, int *fd, char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 16];
    dt_strf(path, sizeof path, "%s/.lock", out_dir);
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0 && errno == ENOENT) return 0; /* no run has written there */
    if (*fd < 0) return dt_strf(err, errlen, "%s: cannot open: %s", path, strerror(errno)), -1;
    if (lock_fd(*fd, LOCK_SH) == 0) return 0;
    lock_failed(out_dir, path, *fd,
                "wait for it to finish (a running run replaces and removes the checkpoints "
                "and files it keeps there)",
                err, errlen);
    close(*fd);
    *fd = -1;
    return -1;
}

void dt_ckpt_unlock(int fd)
{
    if (fd >= 0) close(fd); /* closing the descriptor releases the lock */
}
