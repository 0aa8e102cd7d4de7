/* Training checkpoints: a directory per step under the run's output
 * directory,
 *
 *   OUT/ckpt-00000020/model.safetensors      weights, Hugging Face names
 *   OUT/ckpt-00000020/optimizer.safetensors  exp_avg.NAME, exp_avg_sq.NAME
 *   OUT/ckpt-00000020/state.json             step, data position, optimizer step
 *   OUT/latest                               the newest directory's name
 *
 * A checkpoint is built in a hidden temporary directory and renamed into
 * place whole, then `latest` is replaced atomically, then old ones beyond
 * keep_last are removed: a crash at any point leaves the last good
 * checkpoint intact and `latest` naming a complete one. Saving a step that
 * exists already swaps the two directories atomically (renameat2). */
#ifndef DT_TRAIN_CHECKPOINT_H
#define DT_TRAIN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "model/gpt.h"
#include "model/optimizer.h"

typedef struct {
    long step;             /* optimizer steps completed */
    uint64_t seq_counter;  /* training sequences consumed (the loader's position) */
    uint64_t seed;
    int shuffle;
    int seq_len;
    long global_batch;     /* sequences per optimizer step */
    double last_loss;
    uint64_t data_tokens;  /* tokens of the training data: resuming on other data is refused */
} dt_ckpt_state;

/* Writes a checkpoint of m (parameters) and o (moments) for state->step,
 * then removes older checkpoints beyond keep_last (never newer ones). */
int dt_ckpt_save(const char *out_dir, const dt_gpt *m, const dt_optimizer *o,
                 const dt_ckpt_state *state, long keep_last, char *path_out, size_t path_len,
                 char *err, size_t errlen);

/* Whether out_dir holds checkpoints (or a `latest`) already. */
int dt_ckpt_exists(const char *out_dir);

/* Finds the checkpoint to resume from: `where` is a checkpoint directory, or
 * a run directory whose `latest` names one. */
int dt_ckpt_resolve(const char *where, char *dir, size_t dirlen, char *err, size_t errlen);

/* Reads a checkpoint's sizes (from its weights) so the model can be built. */
int dt_ckpt_model_config(const char *dir, dt_gpt_config *cfg, char *err, size_t errlen);

/* Loads parameters, moments and state into an allocated model and optimizer
 * of the checkpoint's sizes. */
int dt_ckpt_load(const char *dir, dt_gpt *m, dt_optimizer *o, dt_ckpt_state *state, char *err,
                 size_t errlen);

#endif
