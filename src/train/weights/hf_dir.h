/* Model directories as Hugging Face writes and reads them (save_pretrained,
 * from_pretrained): config.json beside model.safetensors, or beside shards
 * (model-00001-of-00002.safetensors, ...) that model.safetensors.index.json
 * lists in its "weight_map" (tensor name -> shard file).
 *
 * Reading (hf_read.c, hf_config.c): the sizes come from config.json, each
 * checked against the weights' shapes; the weights, one file or the
 * shards joined, are read by name like any safetensors file (fp32, bf16
 * or fp16). Writing (hf_save.c): config.json with the family's fields and
 * "architectures", and the parameters in fp32 under Hugging Face's names,
 * one file up to DT_HF_SHARD_BYTES and shards with an index above. */
#ifndef DT_TRAIN_WEIGHTS_HF_DIR_H
#define DT_TRAIN_WEIGHTS_HF_DIR_H

#include <stddef.h>

#include "model/gpt.h"
#include "train/weights/safetensors.h"

#define DT_HF_CONFIG "config.json"
#define DT_HF_WEIGHTS "model.safetensors"
#define DT_HF_INDEX "model.safetensors.index.json"

/* The largest shard written, in bytes: Hugging Face's default
 * max_shard_size, "5GB". DTRAIN_HF_SHARD_BYTES sets another (the tests
 * shard small models with it). */
#define DT_HF_SHARD_BYTES 5000000000LL

/* dir/name, one '/' between them however dir ends. */
void dt_hf_path(char *buf, size_t len, const char *dir, const char *name);

/* Whether path is a directory holding config.json: a model directory, as
 * opposed to a dtrain checkpoint or a run directory. */
int dt_hf_is_model_dir(const char *path);

/* The directory's weights as one file: model.safetensors, or the shards
 * the index names, joined (each shard present, holding the tensors the
 * index places in it, no tensor in two). Refuses a directory without
 * config.json, with neither file or with both. */
int dt_hf_open(const char *dir, dt_st_file *f, char *err, size_t errlen);

/* config.json's sizes into cfg, which holds what the weights' shapes said
 * (dt_weights_inspect's answer for f): each size config.json gives must
 * agree with them; the heads, the context, the rotary base and the
 * norm's epsilon come from it (Hugging Face's defaults where absent), and
 * what dtrain does not compute (rope_scaling, biases, another activation
 * or model_type) is refused by name. */
int dt_hf_config_read(const char *dir, const dt_st_file *f, dt_gpt_config *cfg, char *err,
                      size_t errlen);
/* Whether a model of cfg has a Hugging Face architecture: the family's own
 * blocks, no experts. 0, or -1 with a message. */
int dt_hf_check_model(const dt_gpt_config *cfg, char *err, size_t errlen);
/* config.json for a model of cfg with weights of torch_dtype ("float32"),
 * malloc'd, or NULL with a message when the model has no Hugging Face
 * architecture (experts, other blocks). */
char *dt_hf_config_text(const dt_gpt_config *cfg, const char *torch_dtype, char *err,
                        size_t errlen);

/* Whether an output path names a model directory to write: it ends in
 * '/'. Only the name decides, never what is there: a name that once wrote
 * a file never writes a directory (an existing directory named without the
 * '/' is refused as an output file, as before). */
int dt_hf_is_dir_path(const char *path);
/* Whether dir can be written before the work that produces it starts: a
 * new directory whose nearest existing ancestor is writable, an empty one,
 * or a model directory (config.json) whose weights are replaced; `what`
 * names the option. 0, or -1 with a message. */
int dt_hf_check_output(const char *what, const char *dir, char *err, size_t errlen);
/* Writes m's parameters flat (m's layout) as a model directory: config.json,
 * model.safetensors or shards and the index, each file atomic. A previous
 * save's weight files that this one does not write (another shard count)
 * are removed after, as save_pretrained does; nothing else is touched. */
int dt_hf_save(const dt_gpt *m, const float *flat, const char *dir, dt_st_dtype dtype, char *err,
               size_t errlen);

#endif
