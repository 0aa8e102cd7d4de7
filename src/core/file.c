/* Whole-file reads and directory syncs. See file.h. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

void dt_dir_of(const char *path, char *dir, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        dt_strf(dir, len, ".");
    else if (slash == path)
        dt_strf(dir, len, "/");
    else
        dt_strf(dir, len, "%.*s", (int)(slash - path), path);
}

int dt_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Creates and removes a file in an existing directory; `what` leads the
 * message ("--out runs/a"). */
static int probe_dir(const char *what, const char *dir, char *err, size_t errlen)
{
    char probe[4200];
    dt_strf(probe, sizeof probe, "%s/.dtrain-probe.%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return dt_strf(err, errlen, "%s: cannot create files in %s: %s", what, dir,
                       strerror(errno)), -1;
    close(fd);
    unlink(probe);
    return 0;
}

int dt_check_dir_writable(const char *what, const char *dir, char *err, size_t errlen)
{
    char path[4096];
    if (dt_strf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return dt_strf(err, errlen, "%s: path too long", what), -1;
    for (;;) {
        struct stat st;
        if (stat(path, &st) == 0) {
            if (!S_ISDIR(st.st_mode))
                return dt_strf(err, errlen, "%s %s: %s is not a directory", what, dir, path), -1;
            char who[4200];
            dt_strf(who, sizeof who, "%s %s", what, dir);
            return probe_dir(who, path, err, errlen);
        }
        /* A missing component, or a file where a directory would go: the
         * ancestor that exists says which. */
        if (errno != ENOENT && errno != ENOTDIR)
            return dt_strf(err, errlen, "%s %s: %s: %s", what, dir, path, strerror(errno)), -1;
        /* Up one level: strip trailing slashes, then the last component. */
        char *end = path + strlen(path);
        while (end > path + 1 && end[-1] == '/') *--end = '\0';
        char *slash = strrchr(path, '/');
        if (!slash) {
            memcpy(path, ".", 2);
        } else if (slash == path) {
            path[1] = '\0';
        } else {
            *slash = '\0';
        }
    }
}

/* The kernel's own limit on the links of one name (ELOOP). */
#define LINK_HOPS 40

/* Replaces the symbolic link's name in path (len bytes) with the name it
 * gives: a relative one is read from the link's own directory. */
static int follow_link(char *path, size_t len)
{
    char text[4096], next[4096];
    ssize_t n = readlink(path, text, sizeof text - 1);
    if (n < 0) return -1;
    text[n] = '\0';
    const char *slash = strrchr(path, '/');
    int dir = text[0] == '/' || !slash ? 0 : (int)(slash - path + 1);
    if (dt_strf(next, sizeof next, "%.*s%s", dir, path, text) >= (int)sizeof next ||
        strlen(next) >= len)
        return -1;
    memcpy(path, next, strlen(next) + 1);
    return 0;
}

static const char *what_it_is(mode_t mode)
{
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "neither a file, a character device nor a FIFO";
}

static int refuse(const char *path, mode_t mode, char *err, size_t errlen)
{
    struct stat st;
    int link = lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
    dt_strf(err, errlen, "%s: %s %s; give a file name", path, link ? "a link to" : "is",
            what_it_is(mode));
    return -1;
}

int dt_output_target(const char *path, char *target, size_t len, dt_out_kind *kind, char *err,
                     size_t errlen)
{
    if (dt_strf(target, len, "%s", path) >= (int)len)
        return dt_strf(err, errlen, "%.64s...: path too long", path), -1;
    /* The kernel follows every link, /proc's too (/dev/stdout to a pipe),
     * so a device is opened by the name given. */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        if (!S_ISCHR(st.st_mode) && !S_ISFIFO(st.st_mode))
            return refuse(path, st.st_mode, err, errlen);
        *kind = DT_OUT_STREAM;
        return 0;
    }
    /* A file to replace or create: the temporary one goes beside the name
     * the links end at, a dangling link's included. */
    int found, hops = 0;
    while ((found = lstat(target, &st) == 0) && S_ISLNK(st.st_mode))
        if (++hops > LINK_HOPS || follow_link(target, len) != 0)
            return dt_strf(err, errlen,
                           "%s: its symbolic links lead to no file name (a loop of links, or "
                           "a name too long)",
                           path),
                   -1;
    if (found && !S_ISREG(st.st_mode)) return refuse(path, st.st_mode, err, errlen);
    *kind = found ? DT_OUT_FILE : DT_OUT_NEW; /* creating a new name reports its fault */
    return 0;
}

int dt_check_output_file(const char *what, const char *path, char *err, size_t errlen)
{
    char target[4096], why[4400], who[4200];
    dt_out_kind kind;
    if (dt_output_target(path, target, sizeof target, &kind, why, sizeof why) != 0)
        return dt_strf(err, errlen, "%s %s", what, why), -1;
    dt_strf(who, sizeof who, "%s %s", what, path);
    if (kind == DT_OUT_STREAM) { /* written in place: no file is created */
        if (access(target, W_OK) == 0) return 0;
        return dt_strf(err, errlen, "%s: cannot write %s: %s", who, target, strerror(errno)), -1;
    }
    char dir[4096];
    dt_dir_of(target, dir, sizeof dir);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dt_strf(err, errlen, "%s: the directory %s does not exist", who, dir), -1;
    return probe_dir(who, dir, err, errlen);
}
