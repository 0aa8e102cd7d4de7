/* A pipeline schedule's figures for a step of any number of micro-batches,
 * at a cost bounded by the ranks rather than by the micro-batches: what
 * `dtrain plan` prints under a schedule's chart and what the layout
 * planner's step time takes from the schedule.
 *
 * Up to DT_PLAN_PP_WHOLE(p) micro-batches the real action lists
 * (dt_pp_schedule_build) are simulated whole. Beyond, every schedule is in
 * its steady state: each further micro-batch (p of them for interleaved,
 * which takes them in groups of p) adds the same time to the makespan and
 * the same count of slots (0, or 1 for gpipe) to each rank. The lists are
 * then built and simulated at three counts from 2 p on, one step apart;
 * the figures at M extend the first by the step's difference, once the
 * third has shown that the difference repeats (-1 with a message where it
 * does not: a schedule this does not describe). Time and memory are those
 * of about 2 p micro-batches whatever M is.
 *
 * The slots are the executor's own count from each rank's list
 * (dt_pp_exec_slots): the activations `dtrain train` allocates and holds,
 * a micro-batch's from its first action on a chunk to its last (zb1p's
 * W included). */
#ifndef DT_PLAN_PP_FIGURES_H
#define DT_PLAN_PP_FIGURES_H

#include <stddef.h>

#include "parallel/pipeline/schedule.h"

#define DT_PLAN_PP_WHOLE(p) (4 * (p))

typedef struct {
    double makespan;      /* the step, in the units of cost[] */
    double idle_fraction; /* the ranks' idle time over p x makespan */
    int slots[64];        /* [p] activation slots of each rank's list */
    int from;             /* 0: simulated whole; else the count the figures extend */
} dt_plan_pp_figures;

/* The figures of `kind` over p ranks, V chunks a rank, M micro-batches,
 * with cost[] indexed F, B, I, W (schedule.h). Refuses what
 * dt_pp_schedule_build refuses. 0, or -1 with err. */
int dt_plan_pp_figures_of(dt_pp_kind kind, int p, int V, int M, const double cost[4],
                          dt_plan_pp_figures *out, char *err, size_t errlen);

/* Where the action lists of M micro-batches come from when they are built
 * once and kept (the planner's memo): NULL, with err, when they do not
 * build. */
typedef const dt_pp_schedule *(*dt_plan_pp_lists)(void *ctx, int M, char *err, size_t errlen);

/* The makespan alone, as dt_plan_pp_figures_of gives it, from the lists
 * `lists` hands out (the layout planner's step time needs no slots). 0,
 * or -1 with err. */
int dt_plan_pp_makespan(dt_pp_kind kind, int p, int V, int M, const double cost[4],
                        dt_plan_pp_lists lists, void *ctx, double *makespan, char *err,
                        size_t errlen);

#endif
