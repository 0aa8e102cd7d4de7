/* What the safetensors reader and writer share. Private to src/train. */
#ifndef DT_TRAIN_WEIGHTS_SAFETENSORS_INTERNAL_H
#define DT_TRAIN_WEIGHTS_SAFETENSORS_INTERNAL_H

#include <stddef.h>

/* Doubles hold integers exactly up to 2^53; JSON numbers above that
 * cannot be trusted as offsets or dimensions. */
#define DT_ST_MAX_JSON_INT 9007199254740992.0

/* A message that starts with the file's name; returns -1. */
int dt_st_fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
