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

int dt_check_output_file(const char *what, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return dt_strf(err, errlen, "%s %s: is a directory; give a file name", what, path), -1;
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        memcpy(dir, ".", 2);
    else if (slash == path)
        memcpy(dir, "/", 2);
    else
        dt_strf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dt_strf(err, errlen, "%s %s: the directory %s does not exist", what, path, dir),
               -1;
    char who[4200];
    dt_strf(who, sizeof who, "%s %s", what, path);
    return probe_dir(who, dir, err, errlen);
}
