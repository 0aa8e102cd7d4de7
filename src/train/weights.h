/* The model's flat buffers to and from safetensors files with Hugging Face
 * GPT-2 names, so that a GPT-2 checkpoint loads and ours open in PyTorch.
 * The same code carries optimizer moments, under a name prefix. */
#ifndef DT_TRAIN_WEIGHTS_H
#define DT_TRAIN_WEIGHTS_H

#include <stddef.h>

#include "model/gpt.h"
#include "train/safetensors.h"

/* The model sizes a file implies: vocab_size and n_embd from wte,
 * block_size from wpe, n_layer from the h.{i} blocks; n_head from the
 * file's metadata, or a config.json beside it (Hugging Face's), else 0. */
int dt_weights_inspect(const char *path, dt_gpt_config *cfg, char *err, size_t errlen);

/* Fills flat (the model's layout) from tensors named prefix + HF name (a
 * "transformer." before the HF name is accepted). Every tensor must be there
 * with the model's shape; F32, F16 and BF16 convert. */
int dt_weights_read(const dt_gpt *m, float *flat, const dt_st_file *f, const char *prefix,
                    char *err, size_t errlen);
/* Opens path and reads the parameters into m->params. */
int dt_weights_load(dt_gpt *m, const char *path, char *err, size_t errlen);

/* Writes nbufs flat buffers into one file, buffer i's tensors named
 * prefixes[i] + HF name, with the model sizes in __metadata__. Atomic. */
int dt_weights_write(const dt_gpt *m, const float *const *bufs, const char *const *prefixes,
                     int nbufs, const char *path, char *err, size_t errlen);
/* The parameters alone, HF names: what --save-final writes. */
int dt_weights_save(const dt_gpt *m, const char *path, char *err, size_t errlen);

#endif
