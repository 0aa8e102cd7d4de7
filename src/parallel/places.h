/* What each place of a job holds, said without building anything (no
 * communicator, no buffer): the figures behind `dtrain train --dry-run`
 * and `dtrain plan`. A strategy kind says it through its `places` hook
 * (registry.h); the trainer's memory plan (train/memory/) turns each
 * place's dt_rank_mem into bytes by the ZeRO formulas and prints them.
 *
 * A place is a group of ranks that hold the same: every rank of plain
 * data parallelism, or one (pipeline stage, tensor slice) of a mesh,
 * whose cp x dp ranks beside it hold the same. Its dt_rank_mem with
 * floats == 0 is the whole model, for which memory/plan.h's formulas
 * hold (copies: the ranks ZeRO shards over). */
#ifndef DT_PARALLEL_PLACES_H
#define DT_PARALLEL_PLACES_H

#include <stddef.h>

#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/strategy.h"

typedef struct {
    char label[64];     /* the ranks, as a table's row begins: "every rank",
                           "stage 1 (2 in flight), tp rank 0" */
    int ranks;          /* how many ranks are at this place */
    int stage, tp_rank; /* its pipeline stage and tensor slice on a mesh, for messages
                           that name them; 0 where the kind has neither */
    int in_flight;      /* micro-batches in flight (a pipeline stage's slots); 0: one */
    char layers[64];    /* a pipeline rank's layers ("0-2", "0,4"); "": the model's */
    dt_rank_mem mem;    /* what each of its ranks holds; floats 0: the whole model */
} dt_place;

/* A pipeline whose places are its ranks in order. */
typedef struct {
    int p, V, M, dp; /* ranks, chunks a rank, micro-batches, copies of each stage; p 0: none */
    dt_pp_kind kind;
    dt_pp_part_kind part;
} dt_places_pipe;

typedef struct {
    int n;
    dt_place *at;        /* [n], malloc'd: dt_places_free */
    char rows[256];      /* what a row of the table is, for its heading */
    dt_places_pipe pipe; /* a pipeline alone (no tensor or context parallelism): the
                            stages' table says more of its places */
} dt_places;

/* n empty places (zeroed) in *pl. 0, or -1 with err (out of memory). */
int dt_places_alloc(dt_places *pl, int n, char *err, size_t errlen);
void dt_places_free(dt_places *pl);

/* What a rank whose model is `lay` (a slice, a share of the experts, or
 * the whole) holds for micro-batches of B x T: its floats, the largest
 * segment in use at once, its activations. */
void dt_places_layout_mem(const dt_gpt *lay, int B, int T, dt_rank_mem *out);

/* One place of `world` ranks that each hold the whole model, ZeRO sharding
 * over all of them: what plain data parallelism holds. 0, or -1 with err. */
int dt_places_whole(dt_places *pl, int world, char *err, size_t errlen);

#endif
