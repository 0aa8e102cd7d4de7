/* Small whole-file reads, directory syncs, and checks that an output can
 * be written before the work that produces it starts. */
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

/* Whether files can be created in dir or, when it does not exist yet, in
 * its nearest existing ancestor (where `mkdir -p` would start). A probe
 * file is created and removed: that also catches a read-only filesystem or
 * a root-owned directory that permission bits alone would not show to
 * root. `what` names the option in the message ("--out"). 0, or -1. */
int dt_check_dir_writable(const char *what, const char *dir, char *err, size_t errlen);
/* Whether a file can be written at path later: not a directory, and its
 * directory exists and is writable. 0, or -1 with a message. */
int dt_check_output_file(const char *what, const char *path, char *err, size_t errlen);

#endif
