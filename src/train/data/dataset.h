/* Token data for training: an llm.c token shard (data/shard_header.h:
 * a header of 256 int32, then the tokens as uint16, or as uint32 for a
 * vocabulary over 65,536) or, when a file does not start with either
 * magic, plain text read as bytes (vocabulary 256). Files are read
 * (pread) as batches need them, never loaded whole and never mapped: a
 * file truncated under a run is an error at the next batch ("FILE shrank
 * from N to M bytes while training"), not a SIGBUS.
 *
 * Sequence k of length T is tokens k*T .. k*T+T: the inputs are the first
 * T, the targets the last T (shifted by one). A dataset of n tokens holds
 * (n - 1) / T sequences; which one a training step reads is the
 * sampler's business (data/sampler.h). */
#ifndef DT_TRAIN_DATA_DATASET_H
#define DT_TRAIN_DATA_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"
#include "train/data/sampler.h"
#include "train/data/shard_header.h"

typedef struct dt_dataset dt_dataset;

/* Opens a shard or a text file. Fails, with a message naming the file,
 * for an empty file, a shard of the wrong version, a shard whose size is
 * not 1024 + width * count bytes, or one holding a token beyond the
 * vocabulary its header records. */
int dt_dataset_open(const char *path, dt_dataset **out, char *err, size_t errlen);
/* Each dataset and each view is closed on its own; the mapping goes when
 * the last of them does. */
void dt_dataset_close(dt_dataset *d);

/* For messages: the file, and for a view which part of it. */
const char *dt_dataset_name(const dt_dataset *d);
uint64_t dt_dataset_ntokens(const dt_dataset *d);
/* The vocabulary the data needs: 256 for text; for a shard the header's
 * vocabulary (DT_SHARD_VOCAB_SLOT), or without one the largest token + 1
 * of the whole file (so that views of one file agree). */
int dt_dataset_vocab(const dt_dataset *d);
int dt_dataset_is_text(const dt_dataset *d);
/* Bytes a token in the file: 1 (text), 2 or 4. */
int dt_dataset_width(const dt_dataset *d);
/* The tokenizer the tokens come from: "bytes" for text, the header's
 * record for a shard (spec "" when it records none). */
const dt_tok_ref *dt_dataset_tokenizer(const dt_dataset *d);
/* Token i (0 <= i < ntokens), or UINT32_MAX when the file cannot be read
 * any more: for tests and tools that read a few tokens. */
uint32_t dt_dataset_token(const dt_dataset *d, uint64_t i);
/* Tokens begin .. begin+n-1 into out; the range must lie inside. Fails
 * only when the file shrank or cannot be read. */
int dt_dataset_read(const dt_dataset *d, uint64_t begin, size_t n, uint32_t *out, char *err,
                    size_t errlen);

/* (ntokens - 1) / T, the sequences of length T the data holds. */
uint64_t dt_dataset_nseq(const dt_dataset *d, int T);
/* Fails, saying how many tokens there are and how many are needed, when
 * the data cannot fill one sequence of length T. */
int dt_dataset_check(const dt_dataset *d, int T, char *err, size_t errlen);

/* Fills B sequences of length T, for the counter values first_seq ..
 * first_seq+B-1 (see data/sampler.h): inputs and targets are B*T each. Fails,
 * naming the file and both sizes, when the file has shrunk since it was
 * opened. */
int dt_dataset_batch(const dt_dataset *d, dt_sampler *s, uint64_t first_seq, int B, int T,
                     int32_t *inputs, int32_t *targets, char *err, size_t errlen);

/* Where a validation fraction starts: tokens [0, p) train, [p, n)
 * validate, with n - p = round(n * val_fraction). `dtrain data prepare`
 * and dt_dataset_split cut at the same token. */
uint64_t dt_split_point(uint64_t ntokens, double val_fraction);
/* Two views of d: the training part before dt_split_point and the
 * validation part after it. Each must hold at least two tokens. */
int dt_dataset_split(const dt_dataset *d, double val_fraction, dt_dataset **train,
                     dt_dataset **val, char *err, size_t errlen);
/* A view of tokens [begin, end) of d; `label` names it in messages. */
int dt_dataset_view(const dt_dataset *d, uint64_t begin, uint64_t end, const char *label,
                    dt_dataset **out, char *err, size_t errlen);

#endif
