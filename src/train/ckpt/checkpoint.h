/* Training checkpoints: a directory per step under the run's output
 * directory,
 *
 *   OUT/ckpt-00000020/model.safetensors      weights, Hugging Face names
 *   OUT/ckpt-00000020/optimizer.safetensors  exp_avg.NAME, exp_avg_sq.NAME
 *   OUT/ckpt-00000020/state.json             step, data position, optimizer
 *                                            step, model sizes (ckpt/state.h)
 *   OUT/latest                               the newest directory's name
 *
 * A checkpoint is built in a hidden temporary directory and renamed into
 * place whole, then `latest` is replaced atomically, then old ones beyond
 * keep_last are removed: a crash at any point leaves the last good
 * checkpoint intact. A save that fails (a full disk) withdraws what it
 * had put in place, so the directory resumes from the checkpoint before
 * it, or starts afresh when there was none. Saving a step that exists
 * already swaps the two directories atomically (renameat2).
 *
 * Nothing non-finite is saved or loaded: weights and moments with a NaN or
 * an infinity are refused, naming the tensor, and so is a second moment
 * below zero. */
#ifndef DT_TRAIN_CKPT_CHECKPOINT_H
#define DT_TRAIN_CKPT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "model/gpt.h"
#include "model/optimizer.h"
#include "train/ckpt/state.h"

/* Writes a checkpoint of m (parameters) and o (moments) for state->step,
 * then removes older checkpoints beyond keep_last (never newer ones).
 * Refuses non-finite values, and a state it would not read back. */
int dt_ckpt_save(const char *out_dir, const dt_gpt *m, const dt_optimizer *o,
                 const dt_ckpt_state *state, long keep_last, char *path_out, size_t path_len,
                 char *err, size_t errlen);

/* Whether out_dir holds checkpoints (or a `latest`) already. */
int dt_ckpt_exists(const char *out_dir);

/* Finds the checkpoint to resume from: `where` is a checkpoint directory,
 * or a run directory whose `latest` names one (without a `latest`, its
 * newest checkpoint: a crash between the two renames leaves that). */
int dt_ckpt_resolve(const char *where, char *dir, size_t dirlen, char *err, size_t errlen);

/* The checkpoint's model sizes, so the model can be built. state.json is
 * the authority; the weights file must agree with it (its shapes, and the
 * head count its metadata records). */
int dt_ckpt_model_config(const char *dir, dt_gpt_config *cfg, char *err, size_t errlen);

/* Loads parameters, moments and state into an allocated model and optimizer
 * of the checkpoint's sizes, from a whole or a sharded checkpoint (the
 * one-range case of dt_ckpt_load_ranges). o and state may be NULL. */
int dt_ckpt_load(const char *dir, dt_gpt *m, dt_optimizer *o, dt_ckpt_state *state, char *err,
                 size_t errlen);

/* Checks a checkpoint's files as a load would, reading no value: every
 * shard of a sharded one (present, of the size and checksum its manifest
 * records, of its model, holding exactly the tensors of its pieces), the
 * weights and optimizer files of a whole-model one (whole, every tensor
 * present in its shape). *nfiles: how many files were checked. */
int dt_ckpt_check_files(const char *dir, int *nfiles, char *err, size_t errlen);

#endif
