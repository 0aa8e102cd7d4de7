/* The header of an llm.c token shard: 256 int32, little-endian.
 *
 *   [0] magic   20240520: uint16 tokens (GPT-2's shards; version 1)
 *               20240801: uint32 tokens (llm.c's Llama 3 shards; version 7)
 *   [1] version
 *   [2] the number of tokens
 *
 * llm.c leaves the rest zero and reads none of it. dtrain keeps there
 * what training needs to know of the tokens:
 *
 *   [3]       the vocabulary they come from (256 for byte-level text)
 *   [4]       DT_SHARD_TOK_MARK when a tokenizer is recorded, then
 *   [5] [6]   its split pattern (tokenizer/split.h) and end of text
 *   [8] [9]   its fingerprint, low word first
 *   [16..255] its spec, NUL-terminated: "bytes", "gpt2" or a path
 */
#ifndef DT_TRAIN_DATA_SHARD_HEADER_H
#define DT_TRAIN_DATA_SHARD_HEADER_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

#define DT_SHARD_MAGIC 20240520
#define DT_SHARD_VERSION 1
#define DT_SHARD32_MAGIC 20240801
#define DT_SHARD32_VERSION 7
#define DT_SHARD_HEADER_INTS 256
#define DT_SHARD_HEADER_BYTES (DT_SHARD_HEADER_INTS * 4)
#define DT_SHARD_VOCAB_SLOT 3
#define DT_SHARD_TOK_MARK 0x4B4F5444 /* "DTOK" */
#define DT_SHARD_SPEC_SLOT 16
/* The most tokens a uint16 shard can name: larger vocabularies take uint32. */
#define DT_SHARD_U16_VOCAB 65536

/* What a header says. */
typedef struct {
    int width;        /* bytes a token: 2 or 4 */
    int64_t ntokens;
    int32_t vocab;    /* 0: not recorded */
    dt_tok_ref tok;   /* spec "": none recorded */
} dt_shard_info;

/* The token width a vocabulary needs (0: unknown, taken as uint16). */
static inline int dt_shard_width(int32_t vocab) { return vocab > DT_SHARD_U16_VOCAB ? 4 : 2; }

/* hdr from info (ntokens and all). */
void dt_shard_header_fill(int32_t hdr[DT_SHARD_HEADER_INTS], const dt_shard_info *info);

/* info from hdr, a file's first 1024 bytes (path for messages): fails
 * for a magic or version of neither kind, or a damaged record. */
int dt_shard_header_parse(const char *path, const int32_t hdr[DT_SHARD_HEADER_INTS],
                          dt_shard_info *info, char *err, size_t errlen);

/* Whether a file starting with these 4 bytes is a shard. */
int dt_shard_magic(int32_t first);

#endif
