/* Byte-pair encoding of one piece: its bytes start as single-byte tokens,
 * and the adjacent pair with the lowest-ranked merge is merged, the
 * leftmost on a tie, until no pair merges (tiktoken's order; GPT-2's
 * encoder merges every occurrence of the lowest pair at once, which comes
 * to the same tokens since a merge's parts always rank below it). A heap
 * of candidate pairs keeps a long piece (a line of 100 kB without a
 * space) at n log n rather than n^2. */
#ifndef DT_TOKENIZER_BPE_H
#define DT_TOKENIZER_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/vocab.h"

typedef struct {
    uint64_t key; /* rank << 32 | position of the left token: the heap's order */
    uint32_t left, right, id;
} dt_bpe_cand;

/* What a piece's merging works in, kept between pieces so that encoding
 * allocates only when a piece is longer than any before. */
typedef struct {
    uint32_t *id, *next, *prev;
    dt_bpe_cand *heap;
    size_t cap, heap_cap;
} dt_bpe_scratch;

void dt_bpe_scratch_free(dt_bpe_scratch *s);

/* The tokens of piece p (1 <= n < 2^32 bytes) into out (room for n):
 * their count, or -1 when memory runs out. */
int64_t dt_bpe_encode(const dt_vocab *v, const unsigned char *p, size_t n, dt_bpe_scratch *s,
                      uint32_t *out);

#endif
