/* Output files that appear whole or not at all. The bytes go to
 * `path.tmp.<pid>.<n>`, which is flushed to disk and renamed over `path`,
 * and the directory is flushed too; a crash at any moment leaves either
 * the old file or the new one under `path`, never a half-written file,
 * and two processes writing the same path at once each publish a whole
 * file (the last rename wins).
 *
 * Every writer goes through here, so what `path` names is respected in one
 * place (dt_output_target, core/file.h): a symbolic link is followed and
 * the file it leads to is replaced as above, the link left a link; a
 * character device or a FIFO (/dev/null, /dev/stdout's pipe) is written in
 * place, since a rename would put a regular file where the device was; a
 * directory, a block device or a socket is refused at open. */
#ifndef DT_CORE_ATOMIC_FILE_H
#define DT_CORE_ATOMIC_FILE_H

#include <stddef.h>
#include <stdint.h>

#define DT_PATH_MAX 4096

typedef struct {
    int fd;       /* -1 when not open */
    int in_place; /* a device or a FIFO: written through fd, never renamed */
    char path[DT_PATH_MAX]; /* where the bytes end: path with its links followed */
    char tmp[DT_PATH_MAX + 64]; /* empty when in_place */
} dt_afile;

/* Creates the temporary file (or opens the device). On failure nothing is
 * left behind. */
int dt_afile_open(dt_afile *a, const char *path, char *err, size_t errlen);
/* Appends n bytes; on failure the file is abandoned (dt_afile_abort). */
int dt_afile_write(dt_afile *a, const void *p, size_t n, char *err, size_t errlen);
/* Overwrites n bytes at offset off (a header whose values are known last);
 * a FIFO cannot take it, and the message says so. */
int dt_afile_pwrite(dt_afile *a, uint64_t off, const void *p, size_t n, char *err,
                    size_t errlen);
/* fsync, close, rename over the final path, fsync the directory. On
 * failure the temporary file is removed and the final path is untouched.
 * In place: close, and report what the device said. */
int dt_afile_commit(dt_afile *a, char *err, size_t errlen);
/* Closes and removes the temporary file; safe to call twice. (What was
 * written to a device is gone to it already.) */
void dt_afile_abort(dt_afile *a);

/* The whole file in one call: open, write n bytes, commit. */
int dt_afile_write_file(const char *path, const void *p, size_t n, char *err, size_t errlen);

/* `mkdir -p`: creates dir and its missing parents (mode 0777 & umask). */
int dt_mkdir_p(const char *dir, char *err, size_t errlen);

#endif
