/* Writing llm.c token shards (see data/shard_header.h for the format),
 * streamed and published atomically: the file appears under its name only
 * when every token is on disk and the header holds their count. */
#ifndef DT_TRAIN_DATA_SHARD_WRITE_H
#define DT_TRAIN_DATA_SHARD_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "core/atomic_file.h"
#include "tokenizer/tokenizer.h"
#include "train/data/shard_header.h"

/* The header's count is an int32. */
#define DT_SHARD_MAX_TOKENS 2147483647ull

typedef struct {
    dt_afile file;
    dt_shard_info info; /* ntokens: so far */
} dt_shard_writer;

/* vocab: the vocabulary the tokens come from, recorded in the header
 * (DT_SHARD_VOCAB_SLOT; 256 for byte-level text), or 0 for none; it sets
 * the tokens' width (uint32 above 65,536). tok: the tokenizer to record,
 * or NULL. */
int dt_shard_begin(dt_shard_writer *w, const char *path, int vocab, const dt_tok_ref *tok,
                   char *err, size_t errlen);
/* Appends tokens, each below the vocabulary (below 65,536 without one):
 * another is refused, naming it, and the shard abandoned. */
int dt_shard_append(dt_shard_writer *w, const uint32_t *tokens, size_t n, char *err,
                    size_t errlen);
/* Byte-level tokens: each byte is one token (vocabulary 256). */
int dt_shard_append_bytes(dt_shard_writer *w, const unsigned char *bytes, size_t n, char *err,
                          size_t errlen);
/* Writes the header and publishes the file. A shard needs one token. */
int dt_shard_commit(dt_shard_writer *w, char *err, size_t errlen);
/* Gives up: nothing appears under the path. */
void dt_shard_abort(dt_shard_writer *w);

/* The whole shard in one call. */
int dt_shard_write(const char *path, const uint32_t *tokens, size_t n, int vocab, char *err,
                   size_t errlen);

#endif
