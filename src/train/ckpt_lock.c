/* The output directory's lock. See ckpt_lock.h. */
#include "train/ckpt_lock.h"

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
    int rc;
    while ((rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) continue;
    if (rc == 0) {
        write_holder(fd);
        return fd;
    }
    if (errno == EWOULDBLOCK) {
        char holder[320];
        read_holder(fd, holder, sizeof holder);
        dt_strf(err, errlen,
                "%s is in use by another dtrain run (%s): wait for it to finish, or choose "
                "another --out",
                out_dir, holder);
    } else {
        dt_strf(err, errlen, "%s: cannot lock: %s", path, strerror(errno));
    }
    close(fd);
    return -1;
}

void dt_ckpt_unlock(int fd)
{
    if (fd >= 0) close(fd); /* closing the descriptor releases the lock */
}
