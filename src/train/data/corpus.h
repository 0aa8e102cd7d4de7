/* The corpus training uses when the user gives no data: English text
 * from Debian's `fortunes` package, byte-level, as two llm.c shards in a
 * cache directory. Built once, atomically, from the package's files in
 * sorted name order, so every machine with the same package builds the
 * same bytes, and ranks that race to build it all end up with whole,
 * identical files. */
#ifndef DT_TRAIN_DATA_CORPUS_H
#define DT_TRAIN_DATA_CORPUS_H

#include <stddef.h>

#define DT_FORTUNES_DIR "/usr/share/games/fortunes"
/* The share of the corpus held out for validation (its end). */
#define DT_CORPUS_VAL_FRACTION 0.1

/* $DTRAIN_CACHE, else $XDG_CACHE_HOME/dtrain, else $HOME/.cache/dtrain. */
int dt_cache_dir(char *dir, size_t len, char *err, size_t errlen);

/* Paths of the default corpus's training and validation shards, built
 * under <cache>/fortunes on first use (with a line on stderr saying so). */
int dt_default_corpus(char *train_path, char *val_path, size_t len, char *err, size_t errlen);

/* The files a run reads: `data`, or without it the default corpus; and
 * `val_data`, or the default corpus's when neither was given ("" when the
 * validation rows are to be cut from the training data). 0, or -1. */
int dt_data_files(const char *data, const char *val_data, char *train_path, char *val_path,
                  size_t len, char *err, size_t errlen);

/* The same from any directory of fortune files into out_dir (created if
 * missing); kept if out_dir already holds two valid shards. */
int dt_corpus_build(const char *src_dir, const char *out_dir, char *train_path, char *val_path,
                    size_t len, char *err, size_t errlen);

#endif
