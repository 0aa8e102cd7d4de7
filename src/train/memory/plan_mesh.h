/* What each rank of a mesh (--tp, --cp, --dp, --pp, ZeRO) should hold,
 * without building a model: the arithmetic behind `dtrain train
 * --dry-run` on a mesh and behind `dtrain plan`'s memory figures, the
 * same functions a run's memory table uses (a rank's layout with its tp
 * slice and cp rows, dt_gpt_peer_layout; a pipeline stage's holdings of
 * it, dt_pp_stage_memory; memory/plan_pp.h's P, G and K over them).
 *
 * Ranks at the same (stage, tp rank) hold the same: one plan each. */
#ifndef DT_TRAIN_MEMORY_PLAN_MESH_H
#define DT_TRAIN_MEMORY_PLAN_MESH_H

#include "train/memory/plan_pp.h"

typedef struct {
    int stage, tp_rank; /* the place (stage 0 without a pipeline) */
    int in_flight;      /* a stage's micro-batches in flight (0 without a pipeline) */
    dt_mem_plan plan;
} dt_mesh_rank_plan;

typedef struct {
    int tp, cp, dp, pp;
    int n;                    /* pp x tp plans, stage-major */
    dt_mesh_rank_plan *ranks;
} dt_mem_plan_mesh;

/* One place at a time: begin checks the sizes and cuts the pipeline once,
 * place plans (stage, tp rank), end frees. For `dtrain plan`, which needs
 * only the places that hold the most. */
typedef struct {
    dt_gpt *layout;
    const dt_train_config *c;
    int T, cp, dp, pp;
    dt_pp_schedule sched;
    int *cut; /* NULL without a pipeline */
} dt_mem_plan_mesh_ctx;

int dt_mem_plan_mesh_begin(dt_mem_plan_mesh_ctx *x, dt_gpt *layout, const dt_train_config *c,
                           int world, char *err, size_t errlen);
int dt_mem_plan_mesh_place(dt_mem_plan_mesh_ctx *x, int stage, int tp_rank,
                           dt_mesh_rank_plan *out, char *err, size_t errlen);
/* What the place holds before the ZeRO stage divides it (dt_mem_plan_held
 * turns it into bytes), and its micro-batches in flight. */
int dt_mem_plan_mesh_held(dt_mem_plan_mesh_ctx *x, int stage, int tp_rank, dt_rank_mem *held,
                          int *in_flight, char *err, size_t errlen);
void dt_mem_plan_mesh_end(dt_mem_plan_mesh_ctx *x);

/* The plans of a validated configuration over `world` ranks. layout is
 * the whole model's (its recompute mode the run's); it gains the run's
 * context and sequence parallelism. 0, or -1 with err naming the sizes
 * that do not split. */
int dt_mem_plan_mesh_from_config(dt_gpt *layout, const dt_train_config *c, int world,
                                 dt_mem_plan_mesh *m, char *err, size_t errlen);
void dt_mem_plan_mesh_free(dt_mem_plan_mesh *m);

/* The largest plan's model state and activations, in bytes. */
double dt_mem_plan_mesh_peak(const dt_mem_plan_mesh *m);

/* `--dry-run`'s table: one row per (stage, tp rank). */
void dt_mem_plan_mesh_print(FILE *f, const dt_mem_plan_mesh *m);

#endif
