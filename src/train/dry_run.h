/* `dtrain train --dry-run`: the memory a configuration needs per rank,
 * said without training or allocating the model. The strategy kind says
 * what each place of the job holds (its `places` hook, parallel/places.h);
 * the memory plan turns that into bytes and prints it
 * (memory/plan_places.h). A program that registers a kind with the hook
 * gets a dry run of it through these two calls. */
#ifndef DT_TRAIN_DRY_RUN_H
#define DT_TRAIN_DRY_RUN_H

#include <stddef.h>
#include <stdio.h>

#include "parallel/places.h"
#include "train/config/config.h"

/* Checks a parsed c as a run over `world` ranks would, then what a dry run
 * cannot plan: a kind without the hook, a pipeline cut by times measured
 * when the run starts. 0, or -1 with err naming what would work. */
int dt_dry_run_check(dt_train_config *c, int world, char *err, size_t errlen);

/* The plan of a checked c over `world` ranks: the model's layout (its
 * sizes as a run resolves them: --resume's checkpoint, --init's file, the
 * data's vocabulary; the data is opened, not read), the kind's places, and
 * their table on out (NULL: planned, nothing printed). 0, or -1 with err. */
int dt_dry_run(dt_train_config *c, int world, FILE *out, char *err, size_t errlen);

/* The places the strategy kind of a checked c says a job of `world` ranks
 * has on layout (the whole model's), checked to count the job's ranks:
 * the same arithmetic, and the same refusals, as the dry run's and the
 * simulator's. 0, or -1 with err; dt_places_free after. */
int dt_dry_run_places(const dt_train_config *c, const dt_gpt *layout, int world, dt_places *pl,
                      char *err, size_t errlen);

#endif
