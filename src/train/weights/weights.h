/* The model's flat buffers to and from safetensors files with Hugging Face
 * GPT-2 names, so that a GPT-2 checkpoint loads and ours open in PyTorch.
 * The same code carries optimizer moments, under a name prefix. */
#ifndef DT_TRAIN_WEIGHTS_WEIGHTS_H
#define DT_TRAIN_WEIGHTS_WEIGHTS_H

#include <stddef.h>

#include "model/gpt.h"
#include "model/ranges.h"
#include "train/weights/safetensors.h"

/* path is a safetensors file or a model directory as Hugging Face writes it
 * (weights/hf_dir.h): every function here that takes a path takes either. */

/* The weights at path as one file: the file, or a model directory's
 * model.safetensors or its shards joined. */
int dt_weights_open(const char *path, dt_st_file *f, char *err, size_t errlen);
/* The model sizes a file implies: vocab_size and n_embd from wte,
 * block_size from wpe, n_layer from the h.{i} blocks; n_head from the
 * file's metadata, or a config.json beside it (Hugging Face's), else 0.
 * A model directory's come from its config.json, checked against the
 * shapes. */
int dt_weights_inspect(const char *path, dt_gpt_config *cfg, char *err, size_t errlen);
/* The Llama family's key/value heads from a file's k_proj [KV D, C], D =
 * n_embd / n_head; 0 when the file has none or the shapes disagree. */
int dt_weights_kv_heads(const char *path, int n_head, int n_embd);

/* Fills flat (the model's layout) from tensors named prefix + HF name (a
 * "transformer." before the HF name is accepted). Every tensor must be there
 * with the model's shape and finite values; F32, F16 and BF16 convert. */
int dt_weights_read(const dt_gpt *m, float *flat, const dt_st_file *f, const char *prefix,
                    char *err, size_t errlen);
/* The tensor of f named prefix + the HF name of the layout's tensor k, of
 * its shape; NULL with a message naming both when it is missing or of
 * another shape. */
const dt_st_tensor *dt_weights_tensor(const dt_gpt *m, const dt_st_file *f, const char *prefix,
                                      int k, char *err, size_t errlen);
/* Opens path and reads the parameters into m->params. */
int dt_weights_load(dt_gpt *m, const char *path, char *err, size_t errlen);
/* The same, but only the parameters inside `keep` (flat positions lo,
 * hi), into dst: a flat buffer like m->params (packed 0), or a rank's
 * pieces packed by the ranges' `at` (packed 1). For a rank that holds part
 * of the model (a pipeline stage, a ZeRO shard): nothing else is touched,
 * and the file's pages are let go span by span, so loading never takes the
 * whole model's memory. Every tensor must be in the file with the model's
 * shape; the values read must be finite. */
int dt_weights_load_ranges(dt_gpt *m, const char *path, const dt_flat_ranges *keep, float *dst,
                           int packed, char *err, size_t errlen);

/* Writes nbufs flat buffers into one file, buffer i's tensors named
 * prefixes[i] + HF name, with the model sizes in __metadata__. Atomic.
 * Refuses, naming the tensor, a buffer that holds a NaN or an infinity. */
int dt_weights_write(const dt_gpt *m, const float *const *bufs, const char *const *prefixes,
                     int nbufs, const char *path, char *err, size_t errlen);
/* Tensors [k0, k1) of the layout from flat, named prefix + HF name, in
 * one file with the model sizes in __metadata__ (a model's shard), stored
 * as dtype (F32, or BF16 and F16 rounded to nearest even; a value past
 * F16's range is refused, naming the tensor). */
int dt_weights_write_part(const dt_gpt *m, const float *flat, const char *prefix, int k0, int k1,
                          dt_st_dtype dtype, const char *path, char *err, size_t errlen);
/* The parameters alone, HF names: what --save-final writes. A path that
 * ends in '/' gets a model directory (dt_hf_save). */
int dt_weights_save(const dt_gpt *m, const char *path, char *err, size_t errlen);
/* The same, the values stored as dtype (--save-dtype). */
int dt_weights_save_as(const dt_gpt *m, const char *path, dt_st_dtype dtype, char *err,
                       size_t errlen);
/* --save-dtype's names: fp32, bf16, fp16 (and PyTorch's float32,
 * bfloat16, float16). 0, or -1 for another name. */
int dt_weights_dtype_parse(const char *name, dt_st_dtype *out);
/* PyTorch's name of a dtype, config.json's torch_dtype. */
const char *dt_weights_torch_dtype(dt_st_dtype dtype);
/* Whether dt_weights_save could write path, checked before the work that
 * produces the weights: a file (dt_check_output_file) or a directory
 * (dt_hf_check_output). `what` names the option. */
int dt_weights_check_output(const char *what, const char *path, char *err, size_t errlen);

/* Whether a value of flat (the model's layout, padding left out) makes
 * bad() true: 1 with the first such value's tensor (an index into
 * m->tensors) and element within it, else 0. */
int dt_weights_find(const dt_gpt *m, const float *flat, int (*bad)(float), int *tensor,
                    size_t *elem);
/* 0 when every value of flat is finite; else -1 and err says where the
 * first other is: "tensor PREFIXNAME holds nan at element K". One pass
 * over the parameters, cheap next to a training step: run it on the
 * parameters after each optimizer update to stop before non-finite
 * weights go anywhere. */
int dt_weights_check_finite(const dt_gpt *m, const float *flat, const char *prefix, char *err,
                            size_t errlen);
/* 1 when every x[i] is finite and, with nonneg, none is below zero (-0.0
 * is not); integer operations, so that the pass vectorizes and runs at
 * memory speed: callers search for the culprit only when it says 0. */
int dt_weights_all_finite(const float *x, size_t n, int nonneg);
/* The same over floats [lo, hi) of the flat layout only, held in x (x[0]
 * is float lo): a rank that keeps part of the parameters checks that. */
int dt_weights_check_finite_range(const dt_gpt *m, const float *x, size_t lo, size_t hi,
                                  const char *prefix, char *err, size_t errlen);

#endif
