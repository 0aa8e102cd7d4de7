/* Small whole-file reads and directory syncs. */
#ifndef DT_CORE_FILE_H
#define DT_CORE_FILE_H

#include <stddef.h>

/* The whole file, NUL-terminated (malloc'd; *len without the NUL when len is
 * not NULL), or NULL with a message naming the file when it cannot be
 * opened or read, or holds more than max_bytes. */
char *dt_read_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

/* fsync of a directory, so that renames and creations inside it are on
 * disk. 0, or -1 with errno set. */
int dt_fsync_dir(const char *dir);

#endif
