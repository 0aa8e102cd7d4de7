/* The strategies a run can name (`--strategy NAME`): each kind says how it
 * splits the global batch in a job of a given size and adds this rank's
 * layers to the stack (strategy.h). The built-in kinds are ddp, dp and ps;
 * a program that links libdtrain can register more before it trains (the
 * tests do), and the trainer finds them by name like the built-in ones. */
#ifndef DT_PARALLEL_REGISTRY_H
#define DT_PARALLEL_REGISTRY_H

#include <stddef.h>

#include "parallel/places.h"
#include "parallel/strategy.h"
#include "parallel/zero/zero.h"

/* The settings the built-in kinds read; a kind ignores the others. */
typedef struct {
    size_t bucket_bytes;   /* ddp: gradient bucket size */
    dt_dtype grad_wire;    /* ddp: gradients reduced in DT_F32 or DT_BF16 (ZeRO too) */
    dt_zero_opts zero;     /* ddp: ZeRO (stage 0: none) */
    int devices;           /* dp: devices (threads) */
    int servers;           /* ps: server ranks, the last ones */
    int ps_async;          /* ps: asynchronous updates */
    int staleness;         /* ps async: steps a worker may lead the slowest */
    int fixed_staleness;   /* ps async: pushes in a fixed order, each `staleness` steps late */
    const char *compress;  /* ps: what workers push ("none", "topk:R", "int8") */
    const char *optimizer; /* the optimizer's name, for advice about pairings */
    int pp;                /* ddp: pipeline stages (1: none) */
    int dp;                /* ddp: data-parallel size asked for (0: the ranks / (tp cp pp)) */
    int tp;                /* ddp: tensor-parallel ranks per group (1: none) */
    int sp;                /* ddp with tp: sequence parallelism */
    int cp;                /* ddp: context-parallel ranks per group (1: none) */
    int ep;                /* ddp: expert-parallel ranks per group, from the data-parallel
                            * ones (1: none) */
    const char *cp_algo;   /* ring | ulysses */
    int accum;             /* micro-batches per step (a pipeline's M) */
    int pp_virtual;        /* interleaved: model chunks per rank */
    const char *pp_schedule;  /* naive | gpipe | 1f1b | interleaved | zb1p */
    const char *pp_partition; /* uniform | params | cost */
} dt_parallel_opts;

/* What the `places` hook of a kind is asked about: a job, before anything
 * of it is built. */
typedef struct {
    const dt_parallel_opts *o;
    const dt_gpt *layout; /* the whole model's, with the run's modes (precision, recompute) */
    int world;            /* ranks in the job */
    int B, T;             /* the micro-batch */
} dt_places_job;

typedef struct {
    const char *name;
    const char *summary;
    /* Into how many blocks each global batch splits in a job of `world`
     * ranks; refuses a job the kind cannot run. 0, or -1 with a message. */
    int (*data_parallel_size)(const dt_parallel_opts *o, int world, int *dp, char *err,
                              size_t errlen);
    /* Adds this rank's layers to S (S->rank says which rank). 0 or -1 with
     * S->rank->err. */
    int (*build)(dt_strategy *S, const dt_parallel_opts *o);
    /* What each place of such a job holds (places.h), by arithmetic alone:
     * `dtrain train --dry-run` prints it, `dtrain plan` weighs it. NULL
     * where the kind cannot say (a dry run refuses it). 0, or -1 with err. */
    int (*places)(const dt_places_job *job, dt_places *out, char *err, size_t errlen);
} dt_strategy_kind;

/* Adds a kind (the pointer is kept). -1 when the name is taken or the
 * table is full. */
int dt_strategy_register(const dt_strategy_kind *kind);
/* The kind of that name, or NULL. */
const dt_strategy_kind *dt_strategy_find(const char *name);
/* "ddp|dp|ps|..." for messages and help. */
void dt_strategy_names(char *buf, size_t n);

/* The built-in layers, for kinds that compose them. */
int dt_ddp_strategy(dt_strategy *S, size_t bucket_bytes, dt_dtype wire);
/* DDP over a group of the job (owns: destroyed with the layer); the ranks
 * still step together over the whole job. */
int dt_ddp_strategy_on(dt_strategy *S, dt_comm *group, int owns, size_t bucket_bytes,
                       dt_dtype wire);
/* DDP, or ZeRO at o->zero.stage, over a group of the job that the layer
 * added owns: the data parallelism under a strategy that splits the model
 * (pipeline stages, tensor- and context-parallel groups). */
int dt_data_parallel_on(dt_strategy *S, dt_comm *group, const dt_parallel_opts *o);
int dt_naive_dp_strategy(dt_strategy *S, int devices);
int dt_ps_strategy(dt_strategy *S, const dt_parallel_opts *o);

#endif
