/* The pre-tokenizer: text cut into pieces, each encoded on its own, by
 * one of the two patterns byte-level BPE tokenizers use, matched exactly
 * (leftmost alternative first, as a backtracking regex engine does) but
 * scanned by hand, without a regex engine:
 *
 *   gpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   cl100k  '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *
 * gpt2 is GPT-2's (and r50k's); cl100k is cl100k_base's and Llama 3's.
 * Character classes are unicode.h's; (?i) folds as Unicode's simple case
 * folding does, so "'ſ" (U+017F, long s) is a contraction too. */
#ifndef DT_TOKENIZER_SPLIT_H
#define DT_TOKENIZER_SPLIT_H

#include <stddef.h>

typedef enum { DT_SPLIT_NONE = 0, DT_SPLIT_GPT2, DT_SPLIT_CL100K } dt_split;

/* "gpt2", "cl100k", or "none". */
const char *dt_split_name(dt_split p);
/* 0, or -1 for a name that is neither gpt2 nor cl100k. */
int dt_split_parse(const char *name, dt_split *out);

/* The length in bytes of the piece that starts text (n >= 1 bytes). With
 * final 0, the text goes on past n: 0 when more bytes could change the
 * piece (its end is not in sight), so the caller reads more first. */
size_t dt_split_next(dt_split p, const unsigned char *text, size_t n, int final);

#endif
