/* Output files that appear whole or not at all. The bytes go to
 * `path.tmp.<pid>.<n>`, which is flushed to disk and renamed over `path`,
 * and the directory is flushed too; a crash at any moment leaves either
 * the old file or the new one under `path`, never a half-written file,
 * and two processes writing the same path at once each publish a whole
 * file (the last rename wins). */
#ifndef DT_CORE_ATOMIC_FILE_H
#define DT_CORE_ATOMIC_FILE_H

#include <stddef.h>
#include <stdint.h>

#define DT_PATH_MAX 4096

typedef struct {
    int fd; /* -1 when not open */
    char path[DT_PATH_MAX];
    char tmp[DT_PATH_MAX + 64];
} dt_afile;

/* Creates the temporary file. On failure nothing is left behind. */
int dt_afile_open(dt_afile *a, const char *path, char *err, size_t errlen);
/* Appends n bytes; on failure the file is abandoned (dt_afile_abort). */
int dt_afile_write(dt_afile *a, const void *p, size_t n, char *err, size_t errlen);
/* Overwrites n bytes at offset off (a header whose values are known last). */
int dt_afile_pwrite(dt_afile *a, uint64_t off, const void *p, size_t n, char *err,
                    size_t errlen);
/* fsync, close, rename over the final path, fsync the directory. On
 * failure the temporary file is removed and the final path is untouched. */
int dt_afile_commit(dt_afile *a, char *err, size_t errlen);
/* Closes and removes the temporary file; safe to call twice. */
void dt_afile_abort(dt_afile *a);

/* The whole file in one call: open, write n bytes, commit. */
int dt_afile_write_file(const char *path, const void *p, size_t n, char *err, size_t errlen);

/* `mkdir -p`: creates dir and its missing parents (mode 0777 & umask). */
int dt_mkdir_p(const char *dir, char *err, size_t errlen);

#endif
