/* Writing llm.c token shards (see data/dataset.h for the format), streamed and
 * published atomically: the file appears under its name only when every
 * token is on disk and the header holds their count. */
#ifndef DT_TRAIN_DATA_SHARD_WRITE_H
#define DT_TRAIN_DATA_SHARD_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "core/atomic_file.h"

/* The header's count is an int32. */
#define DT_SHARD_MAX_TOKENS 2147483647ull

typedef struct {
    dt_afile file;
    uint64_t ntokens;
    int vocab;
} dt_shard_writer;

/* vocab: the vocabulary the tokens come from, recorded in the header
 * (DT_SHARD_VOCAB_SLOT; 256 for byte-level text), or 0 for none. */
int dt_shard_begin(dt_shard_writer *w, const char *path, int vocab, char *err, size_t errlen);
int dt_shard_append(dt_shard_writer *w, const uint16_t *tokens, size_t n, char *err,
                    size_t errlen);
/* Byte-level tokens: each byte is one token (vocabulary 256). */
int dt_shard_append_bytes(dt_shard_writer *w, const unsigned char *bytes, size_t n, char *err,
                          size_t errlen);
/* Writes the header and publishes the file. A shard needs one token. */
int dt_shard_commit(dt_shard_writer *w, char *err, size_t errlen);
/* Gives up: nothing appears under the path. */
void dt_shard_abort(dt_shard_writer *w);

/* The whole shard in one call. */
int dt_shard_write(const char *path, const uint16_t *tokens, size_t n, int vocab, char *err,
                   size_t errlen);

#endif
