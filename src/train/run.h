/* The state of one rank's training run, shared by the files of the
 * trainer: trainer.c (the loop and its life), run_state.c (what the rank
 * holds and its starting state, checkpoints), run_report.c (what the run
 * prints and logs, evaluation). Private to src/train. */
#ifndef DT_TRAIN_RUN_H
#define DT_TRAIN_RUN_H

#include <stdint.h>
#include <stdio.h>

#include "core/str.h"
#include "dtrain/comm.h"
#include "kernels/profile.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "parallel/strategy.h"
#include "train/ckpt/state.h"
#include "train/config/config.h"
#include "train/data/dataset.h"
#include "train/data/sampler.h"
#include "train/step_waits.h"

typedef struct dt_run {
    dt_train_config *cfg;
    dt_gpt model;
    dt_optimizer opt;
    dt_dataset *train, *val;
    dt_sampler train_order, val_order;
    dt_rank r;          /* what the strategy sees; r.err is the run's error message */
    dt_strategy S;
    int threads;
    long global_batch;  /* sequences per optimizer step */
    long step;          /* next optimizer step to run */
    long steps_run;     /* steps run by this process */
    uint64_t seq_counter; /* training sequences consumed */
    double last_loss;
    int stop;           /* the signal the ranks agreed to stop on, or 0 */
    int dp_size;        /* blocks of each global batch, as the configuration was validated */
    int lock_fd;        /* the lock on --out (ckpt/lock.h), or -1 */
    double peak;        /* FLOP/s MFU is measured against (all computing ranks); 0: unknown */
    double rank_peak;   /* this process's share of it */
    char peak_desc[512]; /* what that peak is */
    char paths_file[4200]; /* where measured product paths are kept (product_paths.h) */
    int paths_timed;       /* product shape classes this process timed, as last reported */
    struct {            /* --profile (profile.c) */
        int on;
        double bw;              /* copy bandwidth, bytes/s */
        double step_ms, comm_ms; /* summed over the steps counted */
        uint64_t bg_ns, bg_mark;  /* the progress threads' time, summed; at the last step */
        uint64_t data_ns, step_data_ns;
        long steps;
        dt_prof_part sum[DT_PROF_NKINDS];
        dt_prof_shape shapes[DT_PROF_SHAPES]; /* the products by shape, summed */
        int nshapes;
        double last[DT_PROF_NKINDS + 4]; /* the last step's, for the JSON log */
    } prof;
    struct {            /* in-memory snapshots and restarts (snapshots.c) */
        long every;     /* steps between snapshots; 0: none */
        long restart;   /* restarts before this attempt (TORCHELASTIC_RESTART_COUNT) */
        long max_restarts; /* TORCHELASTIC_MAX_RESTARTS */
        long lost;      /* on a restart: the failed attempt's steps lost, or -1 */
        uint64_t failure_ns; /* when the launcher saw the failure (CLOCK_MONOTONIC) */
        long from_step; /* the step this attempt started at */
        uint64_t moved[2]; /* files and bytes its recovery copied between hosts */
        /* The parts of a recovery (dt_now_ns): this attempt's start
         * (dt_train's entry), the end of its rendezvous, the start and end
         * of finding the snapshot, the end of the model's build and load. */
        uint64_t entry_ns, joined_ns, pool_ns, pooled_ns, loaded_ns;
        char dir[256];  /* the job's snapshot directory */
        long count;     /* snapshots this attempt wrote */
        uint64_t write_ns; /* and the time they took the training thread */
        uint64_t wait_ns;  /* of it, waiting for the previous one's write */
        uint64_t bg_ns;    /* the background writes' time (snapshot_writer.c) */
        long bg_count;     /* and their number */
        uint64_t shm_bytes; /* this rank's two slots in /dev/shm */
        uint64_t open_ns;   /* making or mapping them (once an attempt; not in write_ns) */
        struct dt_snap_writer *writer; /* NULL: none started */
    } snap;
    dt_waits_total waits; /* the steps' communication waits (step_waits.h) */
    FILE *json;         /* --log-json, or NULL */
    FILE *out;          /* human-readable lines (rank 0's; /dev/null elsewhere) */
} dt_run;

/* The run's error message buffer, as (buf, len) arguments. */
#define ERR(t) (t)->r.err, sizeof (t)->r.err

static inline int comm_failed(dt_run *t, dt_comm *c, const char *what)
{
    return dt_strf(ERR(t), "%s: %s", what, dt_comm_error(c)), -1;
}

/* run_state.c */
/* Training and validation data (--data, --val-data, or the built-in corpus). */
int dt_run_open_data(dt_run *t);
/* The trainer's batch callback for the strategies (dt_rank.batch). */
int dt_run_fetch_batch(void *ctx, uint64_t first, int n, int32_t *inputs, int32_t *targets,
                       char *err, size_t errlen);
double dt_run_lr_at(const void *cfg, long step);
/* Every file the run will write is writable, checked before the first step. */
int dt_run_check_outputs(dt_run *t);
/* The layout, what the strategy says this rank holds, the starting state
 * (resume_dir: a checkpoint, or NULL), and the ranks' agreement on it. */
int dt_run_setup_model(dt_run *t, const char *resume_dir);
/* A checkpoint of the current step into --out (collective: the strategy
 * gathers), or into the run directory dir keeping keep (its path into
 * path; empty on a rank that writes nothing). */
int dt_run_save(dt_run *t);
int dt_run_save_to(dt_run *t, const char *dir, long keep, char *path, size_t len);
/* What a checkpoint of the current step records of the run. */
dt_ckpt_state dt_run_ckpt_state(dt_run *t);
/* The layout checkpoints and weights files are in: the whole model's
 * where this rank holds slices of it (tensor parallelism), else its own. */
dt_gpt *dt_run_file_layout(dt_run *t);
/* Ranges of this rank's flat layout (NULL: all of it, in place) as the
 * file layout sees them: the same, or moved into the whole model's
 * layout (S->in_whole). *tmp: what to free after. 0, or -1. */
int dt_run_file_ranges(dt_run *t, const dt_flat_ranges *mine, dt_flat_ranges *out,
                       dt_flat_range **tmp);

/* snapshot_writer.c */
/* The writer thread and its staging memory (touched here, before the
 * first step, rather than by the first snapshot's copy). 0 or -1. */
int dt_run_snapshot_writer_start(dt_run *t);
/* A snapshot of the current step into t->snap.dir (collective over the
 * ranks that write): begun here, copied by a background thread while the
 * next step computes (0); with save, also saved to --out from the slot in
 * the background. 1: no way to take it so (the optimizer's state on NVMe:
 * the caller saves synchronously). -1 on failure. */
int dt_run_snapshot_stage(dt_run *t, int save);
/* The background write finished (abandon 0: waited for; its failure is
 * the run's) or given up (1: after an error, nothing half published), the
 * thread joined, the staging memory freed. 0 or -1. */
int dt_run_snapshot_writer_end(dt_run *t, int abandon);
/* Waits for the background write, if any: 0, or -1 when it failed. */
int dt_run_snapshot_settle(dt_run *t);

/* snapshots.c */
/* Snapshots (under a launcher that restarts) and, on a restart, where the
 * run continues from: the snapshot in memory, else --out's newest
 * checkpoint, else what --resume named, else the start. Sets
 * t->r.resuming and *where (NULL: a fresh start); 0 or -1. */
int dt_run_snapshots_setup(dt_run *t, const char **where);
/* Whether the launcher allows restarts (snapshots are then written: a
 * strategy keeps what a checkpoint needs). */
int dt_run_snapshots_wanted(void);
/* After the starting state is in place: room for the snapshots, and on a
 * restart what failed and where the run continues from (rank 0's line). */
int dt_run_snapshots_start(dt_run *t, const char *where);
/* After step t->step - 1: a snapshot when one is due or save is set
 * (collective), and on a restart's first step the time since the
 * failure. save: the snapshot goes to --out too (--save-every). */
int dt_run_snapshot_after_step(dt_run *t, int save);
/* Whether --save-every's saves are taken from snapshots in the background
 * (snapshots on, the state in memory): the same on every rank. */
int dt_run_snapshots_save_async(const dt_run *t);
/* Rank 0's line on the snapshots written, against train_s seconds of
 * training. */
void dt_run_snapshots_summary(dt_run *t, double train_s);

/* shrink.c: a job that may shrink (dtrain launch --min-nproc) */
/* DTRAIN_VIRTUAL_WORLD_SIZE into r.vsize, and the layout checked for it
 * (before joining the job). 0, or -1 with err. */
int dt_run_virtual_env(dt_run *t, char *err, size_t n);
/* Once this rank has joined the job: the variable checked against its
 * size, and the launcher told (DTRAIN_LAUNCH_JOINED_FD). 0, or -1. */
int dt_run_virtual_joined(dt_run *t, char *err, size_t n);
/* Rank 0's line when the job runs on fewer ranks than it started with. */
void dt_run_print_shrink(dt_run *t);

/* run_report.c */
/* The configuration, model, data and batch, and each rank's memory by kind
 * beside the ZeRO formulas for its stage, dtype and rank count, with the
 * activation estimate (train/memory/plan.h). Collective over the job where
 * the formulas hold (--strategy ddp: every rank calls it); 0 or -1. */
int dt_run_print_header(dt_run *t);
/* A validation loss, printed and logged (final: the one at the end). */
int dt_run_eval(dt_run *t, int final);
/* Every rank's peak memory by kind and peak RSS, printed by rank 0 beside
 * the formulas where they hold (collective). */
int dt_run_print_memory(dt_run *t, const char *title);
/* That every rank holds the same weights (collective). */
int dt_run_check_replicas(dt_run *t);
/* --log-json, keeping the entries before a resumed step. */
int dt_run_open_log(dt_run *t, int resuming);
/* After a write to the JSON log: e is 0 or the errno of a failed write. */
int dt_run_log_failed(dt_run *t, int e);

#endif
