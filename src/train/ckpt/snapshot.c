/* Where a job's in-memory snapshots live, and their removal. See
 * snapshot.h. */
#include "train/ckpt/snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/str.h"
#include "train/ckpt/internal.h"

int dt_snapshot_dir(const char *job_id, char *buf, size_t len)
{
    int n = snprintf(buf, len, "/dev/shm/dtrain-snap-%s", job_id);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

int dt_snapshot_remove(const char *job_id, char *err, size_t errlen)
{
    char dir[256], path[DT_PATH_MAX + 256];
    if (dt_snapshot_dir(job_id, dir, sizeof dir))
        return dt_strf(err, errlen, "job id '%s' is too long for a snapshot path", job_id), -1;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        dt_strf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            dt_ckpt_remove_tree(path); /* a snapshot: files only */
        else
            unlink(path);
    }
    closedir(d);
    if (rmdir(dir) < 0 && errno != ENOENT)
        return dt_strf(err, errlen, "cannot remove %s: %s", dir, strerror(errno)), -1;
    return 0;
}
