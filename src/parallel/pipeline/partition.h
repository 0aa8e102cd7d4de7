/* Which layers each pipeline stage runs: S stages of consecutive layers,
 * at least one each, the embeddings with stage 0 and the final LayerNorm
 * with the tied head on stage S - 1. A partition is the cut points, data
 * that the executor, the memory plan and `dtrain plan` all read. */
#ifndef DT_PARALLEL_PIPELINE_PARTITION_H
#define DT_PARALLEL_PIPELINE_PARTITION_H

#include <stddef.h>

typedef enum { DT_PP_PART_UNIFORM, DT_PP_PART_PARAMS, DT_PP_PART_COST } dt_pp_part_kind;

/* "uniform", "params", "cost". 0, or -1. */
int dt_pp_part_parse(const char *name, dt_pp_part_kind *out);

/* Equal layer counts: L / S each, the first L % S stages one more (the
 * last stage already carries the head, the heaviest piece). cut[k] is the
 * first layer of stage k, cut[S] = L. 0, or -1 with err when S > L. */
int dt_pp_cut_uniform(int L, int S, int *cut, char *err, size_t errlen);

/* Consecutive layers, each of weight w[l], into S stages; stage 0 also
 * carries `first` and stage S - 1 `last`. Minimises the heaviest stage
 * (ties: the earliest cut), exactly, by dynamic programming over the cut
 * points. 0, or -1 with err when S > L. */
int dt_pp_cut_balanced(int L, int S, const double *w, double first, double last, int *cut,
                       char *err, size_t errlen);

#endif
