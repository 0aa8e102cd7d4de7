/* A text file's documents as tokens, for `dtrain data prepare
 * --tokenizer`: each document (the whole file, or each part between two
 * separators) is preceded by the end-of-text token, as in GPT-2's training
 * data and llm.c's shards, so the model learns where one ends and the next
 * begins and the file starts with end of text. Empty documents are left
 * out; a separator is dropped. The file is read a megabyte at a time:
 * its size is bounded by the disk, not memory. */
#ifndef DT_TRAIN_DATA_TEXT_TOKENS_H
#define DT_TRAIN_DATA_TEXT_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* Where the tokens go, a batch at a time. 0, or -1 with a message. */
typedef int (*dt_tokens_sink)(void *ctx, const uint32_t *ids, size_t n, char *err,
                              size_t errlen);

typedef struct {
    uint64_t bytes, docs, tokens;
} dt_text_stats;

/* sep: the separator's bytes (seplen), or NULL for a single document. The
 * tokenizer must have an end of text. 0, or -1 with a message naming the
 * file. */
int dt_text_tokenize(const char *path, dt_tokenizer *t, const char *sep, size_t seplen,
                     dt_tokens_sink sink, void *ctx, dt_text_stats *st, char *err,
                     size_t errlen);

#endif
