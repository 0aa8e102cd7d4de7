/* The training loop of one process: data, model, optimizer, evaluation,
 * logging and checkpoints, driven by a validated dt_train_config. */
#ifndef DT_TRAIN_TRAINER_H
#define DT_TRAIN_TRAINER_H

#include <stddef.h>

#include "train/config/config.h"

/* Runs the whole training. 0 on success, -1 with a message naming what went
 * wrong (a file, a setting, a tensor). The config must have been parsed;
 * dt_train validates it. */
int dt_train(dt_train_config *cfg, char *err, size_t errlen);

/* Whether the layout can keep its data-parallel blocks over fewer ranks
 * (dtrain launch --min-nproc): 0, or -1 with err naming what cannot and
 * what can (train/shrink.c). */
int dt_config_check_shrink(const dt_train_config *c, char *err, size_t n);

#endif
