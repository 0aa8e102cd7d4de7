/* Which layers each pipeline stage runs: S stages of consecutive layers,
 * at least one each, the embeddings with stage 0 and the final LayerNorm
 * with the tied head on stage S - 1. A partition is the cut points, data
 * that the executor, the memory plan and `dtrain plan` all read. */
#ifndef DT_PARALLEL_PIPELINE_PARTITION_H
#define DT_PARALLEL_PIPELINE_PARTITION_H

#include <stddef.h>

#include "model/gpt.h"
#include "parallel/pipeline/partition_cost.h"

typedef enum { DT_PP_PART_UNIFORM, DT_PP_PART_PARAMS, DT_PP_PART_COST } dt_pp_part_kind;

/* "uniform", "params", "cost". 0, or -1. */
int dt_pp_part_parse(const char *name, dt_pp_part_kind *out);

/* Equal layer counts: L / S each, the first L % S stages one more (the
 * last stage already carries the head, the heaviest piece). cut[k] is the
 * first layer of stage k, cut[S] = L. 0, or -1 with err when S > L. */
int dt_pp_cut_uniform(int L, int S, int *cut, char *err, size_t errlen);

/* Consecutive layers, each of weight w[l], into S stages; stage 0 also
 * carries `first` and stage S - 1 `last`. Minimises the heaviest stage
 * exactly, by dynamic programming over the cut points (among equally good
 * cuts: the longest last stage, then the longest stage before it, and so
 * on). 0, or -1 with err when S > L. */
int dt_pp_cut_balanced(int L, int S, const double *w, double first, double last, int *cut,
                       char *err, size_t errlen);

/* The cut of model m's layers into S stages by `part`: uniform; params,
 * balancing what each stage holds (a layer's parameters by its kinds,
 * 12 C^2 + 13 C for GPT-2's; the embeddings
 * on the first stage and, tied, with ln_f on the last); cost, balancing
 * the measured costs (NULL: refused, the cut needs them). interleaved:
 * the schedule's S stages must be equal, so S divides the layers (only
 * uniform reaches here: the others are refused with the schedule).
 * cut[S + 1]. Pure arithmetic: the run and the memory plan cut alike.
 * 0, or -1 with err. */
int dt_pp_cut(const dt_gpt *m, int S, dt_pp_part_kind part, int interleaved,
              const dt_pp_costs *costs, int *cut, char *err, size_t errlen);

#endif
