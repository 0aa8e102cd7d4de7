/* Small whole-file reads, directory syncs, and checks that an output can
 * be written before the work that produces it starts. */
#ifndef DT_CORE_FILE_H
#define DT_CORE_FILE_H

#include <stddef.h>

/* The whole file, NUL-terminated (malloc'd; *len without the NUL when len is
 * not NULL), or NULL with a message naming the file when it cannot be
 * opened or read, or holds more than max_bytes. */
char *dt_read_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

/* The directory of path's last name: "." for a bare name, "/" for one in
 * the root. */
void dt_dir_of(const char *path, char *dir, size_t len);

/* fsync of a directory, so that renames and creations inside it are on
 * disk. 0, or -1 with errno set. */
int dt_fsync_dir(const char *dir);

/* How an output path is written. A NEW name or a regular FILE is replaced
 * whole (a temporary file renamed over it); a STREAM (a character device
 * such as /dev/null, or a FIFO) is written in place, since a rename would
 * put a regular file where the device was. */
typedef enum { DT_OUT_NEW, DT_OUT_FILE, DT_OUT_STREAM } dt_out_kind;

/* Where an output path leads, its symbolic links followed (a relative one
 * from the link's own directory; a dangling one to the name it gives), so
 * that a link stays a link and the file it points to is what is written:
 * that name goes to target (len bytes), and how to write it to *kind.
 * Refuses, with a message naming path and what it is, a directory, a
 * block device or a socket, a loop of links, or a path longer than len.
 * 0, or -1. */
int dt_output_target(const char *path, char *target, size_t len, dt_out_kind *kind, char *err,
                     size_t errlen);

/* Whether files can be created in dir or, when it does not exist yet, in
 * its nearest existing ancestor (where `mkdir -p` would start). A probe
 * file is created and removed: that also catches a read-only filesystem or
 * a root-owned directory that permission bits alone would not show to
 * root. `what` names the option in the message ("--out"). 0, or -1. */
int dt_check_dir_writable(const char *what, const char *dir, char *err, size_t errlen);
/* Whether a file can be written at path later, where dt_output_target
 * leads: not refused there, and a file to create or replace has a
 * directory that exists and is writable. 0, or -1 with a message. */
int dt_check_output_file(const char *what, const char *path, char *err, size_t errlen);

#endif
