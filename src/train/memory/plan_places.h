/* A job's places (parallel/places.h, what a strategy kind says each group
 * of ranks holds) turned into bytes by the memory plan's formulas, and
 * `dtrain train --dry-run`'s table of them. */
#ifndef DT_TRAIN_MEMORY_PLAN_PLACES_H
#define DT_TRAIN_MEMORY_PLAN_PLACES_H

#include <stdio.h>

#include "parallel/places.h"
#include "train/memory/plan_pp.h"

/* Each place's plan into plan[pl->n] (dt_mem_plan_held by c's precision,
 * optimizer and ZeRO stage, over the place's copies), on layout, the whole
 * model's. 0, or -1 with err. */
int dt_mem_plan_places(const dt_gpt *layout, const dt_train_config *c, const dt_places *pl,
                       dt_mem_plan *plan, char *err, size_t errlen);

/* The plans' table (NULL f: none, the plans only made): the ZeRO formulas'
 * when a single place holds the whole model, a pipeline's stages' where
 * the places are those (pl->pipe), else a row per place under pl->rows.
 * 0, or -1 with err. */
int dt_mem_plan_places_print(FILE *f, const dt_gpt *layout, const dt_train_config *c,
                             const dt_places *pl, char *err, size_t errlen);

#endif
