/* A byte-level BPE vocabulary: each token id's bytes, the id of each
 * single byte, the merges (which two adjacent tokens become which, and
 * their priority) and the end-of-text token. Filled by a loader
 * (vocab_gpt2.c, vocab_ranks.c); bpe.c encodes with it. */
#ifndef DT_TOKENIZER_VOCAB_H
#define DT_TOKENIZER_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/bytemap.h"

/* A merge: tokens left and right, next to each other, become token id;
 * of the merges a piece allows, the lowest rank goes first. */
typedef struct {
    uint64_t key; /* left << 32 | right; DT_MERGE_FREE in a free slot */
    uint32_t rank, id;
} dt_merge;

/* No pair: ids are below 2^31. */
#define DT_MERGE_FREE UINT64_MAX

typedef struct {
    uint32_t n;            /* ids 0 .. n-1 */
    uint32_t *off, *len;   /* id's bytes: bytes + off[id], len[id] bytes; len 0: no token */
    unsigned char *bytes;
    size_t nbytes, bytes_cap;
    dt_bytemap ids;        /* bytes -> id, for ordinary (not special) tokens */
    uint32_t byte_id[256]; /* the token of each single byte */
    dt_merge *merges;      /* open addressing on key */
    size_t merges_cap, nmerges;
    int32_t eot;           /* the end-of-text token, or -1 */
    /* tiktoken's rule: a piece that is a token whole is that token, and
     * any two tokens whose bytes together are a token merge. GPT-2's
     * encoder merges only the pairs vocab.bpe lists, and nothing else. */
    int tiktoken;
} dt_vocab;

/* An empty vocabulary with room for n ids. 0, or -1 (memory). */
int dt_vocab_init(dt_vocab *v, uint32_t n);
void dt_vocab_free(dt_vocab *v);

/* Gives id the bytes p (n > 0), unless they are another id's already:
 * then 1 and that id in *other. 0, 1, or -1 (memory). Special tokens
 * (special set) are not looked up by their bytes. */
int dt_vocab_set(dt_vocab *v, uint32_t id, const void *p, size_t n, int special,
                 uint32_t *other);

/* The id of bytes p (n), or -1. */
static inline int64_t dt_vocab_find(const dt_vocab *v, const void *p, size_t n)
{
    const uint32_t *id = dt_bytemap_find(&v->ids, v->bytes, p, n, dt_bytes_hash(p, n));
    return id ? (int64_t)*id : -1;
}

/* Records that left then right merge into id at rank. 0, or -1 (memory). */
int dt_vocab_add_merge(dt_vocab *v, uint32_t left, uint32_t right, uint32_t rank, uint32_t id);

/* The merge of left then right, or NULL. */
static inline const dt_merge *dt_vocab_merge(const dt_vocab *v, uint32_t left, uint32_t right)
{
    uint64_t key = (uint64_t)left << 32 | right;
    size_t mask = v->merges_cap - 1;
    for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> 20 & mask;; i = (i + 1) & mask) {
        if (v->merges[i].key == key) return &v->merges[i];
        if (v->merges[i].key == DT_MERGE_FREE) return NULL;
    }
}

/* The ids of the 256 single bytes, after every token is set: -1 and the
 * first byte without a token in *missing when one has none. */
int dt_vocab_find_bytes(dt_vocab *v, int *missing);

/* Every id below upto has bytes: -1 and the first without in *hole. */
int dt_vocab_check_dense(const dt_vocab *v, uint32_t upto, uint32_t *hole);

/* tiktoken's merges, from the tokens alone: each way of cutting a token
 * in two tokens is a merge into it, at its id. 0, or -1 (memory). */
int dt_vocab_merges_from_tokens(dt_vocab *v);

/* Loaders. Each fills an initialised-by-it vocabulary, or fails with a
 * message naming the file, the line and what was wrong (and frees it). */

/* GPT-2's files in dir: encoder.json (each token, its bytes spelled in
 * GPT-2's printable alphabet for bytes, and its id) and vocab.bpe (the
 * merges, in rank order). Its end of text is <|endoftext|>. */
int dt_vocab_load_gpt2(dt_vocab *v, const char *dir, char *err, size_t errlen);

/* A tiktoken ranks file (cl100k_base.tiktoken, Llama 3's tokenizer.model):
 * a line per token, its bytes in base64, a space, its rank (its id), the
 * ranks 0 .. N-1 each once. The end of text is eot, an id outside the
 * ranks, or N (the id after the last rank) when eot is -1. */
int dt_vocab_load_ranks(dt_vocab *v, const char *path, int64_t eot, char *err, size_t errlen);

/* A fingerprint of what encoding and decoding depend on: each id's
 * bytes, the merges' pairs in rank order, the end of text, the rule. */
uint64_t dt_vocab_fingerprint(const dt_vocab *v);

#endif
