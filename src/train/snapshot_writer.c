/* In-memory snapshots (snapshots.c decides when), written as the next
 * step computes: at the snapshot point the training thread does what is
 * collective (the ranks agree that the previous snapshot is whole on
 * every rank, ckpt/shard.h's slots) and hands the copy to a thread of its
 * own, which copies this rank's parameters and optimizer state straight
 * from the live buffers into the slot's mapped shard file, with no call to
 * the communicator (the training thread owns it). The forward and
 * backward passes only read those buffers; the update writes them, so the
 * step waits for the copy just before its update (dt_rank.before_update).
 *
 * What a rank writes: its ranges of a sharded save (ZeRO's pieces, a
 * stage's or a tensor-parallel rank's); under plain data parallelism,
 * where every rank holds the same whole state, an even share of it, so
 * that the ranks copy in parallel; else (one writer) all of it.
 *
 * The handoff: the job belongs to the training thread while `pending` is
 * 0 and to the copier while it is 1; `pending` changes only under the
 * mutex, so each side's writes happen before the other side reads them.
 *
 * The optimizer state on NVMe (t->opt.store) is mapped from its store
 * only around a save: those runs snapshot on the training thread with the
 * checkpoint writers (dt_run_snapshot_stage returns 1). A layer that
 * writes the parameters before the update (a parameter-server worker's
 * pull) has its snapshot copied on the training thread too. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/timer.h"
#include "core/trace.h"
#include "train/ckpt/shard.h"
#include "train/run.h"

typedef struct dt_snap_writer {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, quit;
    int copied; /* the job's copy is done (its save, if any, may still run) */
    atomic_int abandon;
    dt_ckpt_slots *slots; /* opened by the first snapshot */
    long keep;            /* --keep-last, for a save */
    char saved[4096];     /* the checkpoint the last save published, to print */
    uint64_t save_ns;
    /* The last copy's result: the copier's while pending. */
    int failed;
    char err[1024];
    uint64_t write_ns;
    long writes;
} dt_snap_writer;

/* For the test of a rank killed while a snapshot is written:
 * DTRAIN_SNAPSHOT_TEST_WRITE_MS holds each copy of the job's first
 * attempt back that long (the restarted one runs at its pace). */
static void test_delay(void)
{
    const char *v = getenv("DTRAIN_SNAPSHOT_TEST_WRITE_MS");
    const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
    long ms = v ? atol(v) : 0;
    if (ms <= 0 || (restart && atol(restart) > 0)) return;
    const struct timespec d = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&d, NULL);
}

/* One copy into the slot begun, its time and result recorded. */
static void copy_now(dt_snap_writer *w)
{
    const uint64_t t0 = dt_now_ns();
    test_delay();
    const int rc = dt_ckpt_slots_write(w->slots, w->err, sizeof w->err);
    const uint64_t t1 = dt_now_ns();
    w->failed = rc != 0;
    w->write_ns += t1 - t0;
    w->writes++;
    dt_trace_args a = dt_trace_noargs();
    a.bytes = (long long)(dt_ckpt_slots_bytes(w->slots) / 2);
    dt_trace_add(DT_TRACE_COMM, "snapshot_copy", t0, t1, &a);
}

/* The snapshot's save to disk, from the slot (--save-every). */
static void save_now(dt_snap_writer *w)
{
    const uint64_t t0 = dt_now_ns();
    const int rc = dt_ckpt_slots_save(w->slots, w->keep, &w->abandon, w->saved, sizeof w->saved,
                                      w->err, sizeof w->err);
    w->failed = rc != 0;
    w->save_ns = dt_now_ns() - t0;
    dt_trace_add(DT_TRACE_COMM, "checkpoint_save", t0, t0 + w->save_ns, NULL);
}

/* A job: the copy, then (its slot read, not written) the save. */
static void run_job(dt_snap_writer *w)
{
    copy_now(w);
    pthread_mutex_lock(&w->mu);
    w->copied = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (!w->failed && dt_ckpt_slots_saving(w->slots) && !atomic_load(&w->abandon)) save_now(w);
}

static void *copier_main(void *arg)
{
    dt_snap_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->pending && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->pending) break;
        pthread_mutex_unlock(&w->mu);
        run_job(w);
        pthread_mutex_lock(&w->mu);
        w->pending = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Waits for the job under way, its save included; its failure's message,
 * or NULL. */
static const char *wait_copy(dt_snap_writer *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->pending) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    return w->failed ? w->err : NULL;
}

/* dt_rank.before_update: the copy reads what the update writes (a save
 * reads the slot, not the state, and goes on). */
static void before_update(void *ctx)
{
    dt_run *t = ctx;
    dt_snap_writer *w = t->snap.writer;
    const uint64_t t0 = dt_now_ns();
    pthread_mutex_lock(&w->mu);
    while (w->pending && !w->copied) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    const uint64_t t1 = dt_now_ns();
    t->snap.wait_ns += t1 - t0;
    t->snap.write_ns += t1 - t0;
    dt_trace_add(DT_TRACE_COMPUTE, "snapshot_wait", t0, t1, NULL);
}

/* ---- what this rank writes ---------------------------------------------- */

typedef struct {
    const dt_flat_ranges *mine; /* NULL: nothing */
    dt_comm *group;             /* the ranks that write; NULL: this one alone */
    dt_flat_range split;        /* the share of a replica, or the whole */
    dt_flat_ranges own;
} share;

static void choose(dt_run *t, share *s)
{
    const size_t n = t->model.n_floats;
    *s = (share){0};
    if (t->S.saves || t->S.shard) {
        s->mine = t->S.saves ? t->S.saves : t->S.shard;
        s->group = t->S.save_group ? t->S.save_group : t->S.lockstep;
        return;
    }
    if (t->S.replicas) {
        const size_t r = (size_t)dt_comm_rank(t->S.replicas);
        const size_t k = (size_t)dt_comm_size(t->S.replicas);
        s->split = (dt_flat_range){n * r / k, n * (r + 1) / k, n * r / k};
        s->group = t->S.replicas;
    } else if (t->S.writes_checkpoints) {
        s->split = (dt_flat_range){0, n, 0};
    } else {
        return;
    }
    s->own = (dt_flat_ranges){1, &s->split, n};
    s->mine = &s->own;
}

/* The slots, on the first snapshot (collective over the writers): the
 * ranges in the file's layout, once with the moments' `at` and once with
 * the parameters' (their place in the strategy's pieces, or in the
 * model's flat buffer). */
static int open_slots(dt_run *t, dt_snap_writer *w, share *s)
{
    float *pieces = dt_strategy_pieces(&t->S);
    const dt_flat_ranges *mine = s->mine;
    dt_flat_range *by_lo = NULL, *tmp_m = NULL, *tmp_p = NULL;
    dt_flat_ranges own_p = *mine, in_file, in_file_p;
    if (!pieces) {
        if (!(by_lo = malloc((size_t)mine->n * sizeof *by_lo)))
            return dt_strf(ERR(t), "snapshots: out of memory"), -1;
        for (int i = 0; i < mine->n; i++)
            by_lo[i] = (dt_flat_range){mine->r[i].lo, mine->r[i].hi, mine->r[i].lo};
        own_p = (dt_flat_ranges){mine->n, by_lo, t->model.n_floats};
    }
    int rc = dt_run_file_ranges(t, mine, &in_file, &tmp_m) ||
             dt_run_file_ranges(t, &own_p, &in_file_p, &tmp_p) ||
             dt_ckpt_slots_open(&w->slots, t->snap.dir, dt_run_file_layout(t), &in_file,
                                &in_file_p, pieces ? pieces : t->model.params, &t->opt,
                                t->cfg->zero_stage, s->group, ERR(t));
    free(by_lo);
    free(tmp_m);
    free(tmp_p);
    if (rc == 0) t->snap.shm_bytes = dt_ckpt_slots_bytes(w->slots);
    return rc ? -1 : 0;
}

/* ---- the thread --------------------------------------------------------- */

int dt_run_snapshot_writer_start(dt_run *t)
{
    share s;
    choose(t, &s);
    if (t->snap.writer || t->opt.store || !s.mine) return 0;
    dt_snap_writer *w = calloc(1, sizeof *w);
    if (!w) return dt_strf(ERR(t), "snapshots: out of memory"), -1;
    if (pthread_mutex_init(&w->mu, NULL) == 0) {
        if (pthread_cond_init(&w->cv, NULL) == 0) {
            if (pthread_create(&w->thread, NULL, copier_main, w) == 0) {
                t->snap.writer = w;
                t->r.before_update = before_update;
                t->r.update_ctx = t;
                return 0;
            }
            pthread_cond_destroy(&w->cv);
        }
        pthread_mutex_destroy(&w->mu);
    }
    free(w);
    return dt_strf(ERR(t), "snapshots: cannot start the copying thread"), -1;
}

/* Rank 0's line for a checkpoint a save published in the background. */
static void report_saved(dt_run *t, dt_snap_writer *w)
{
    if (!w->saved[0]) return;
    fprintf(t->out, "checkpoint %s (saved from the snapshot in the background in %.0f ms)\n",
            w->saved, (double)w->save_ns * 1e-6);
    w->saved[0] = 0;
}

int dt_run_snapshot_stage(dt_run *t, int save)
{
    if (t->opt.store) return 1;
    dt_snap_writer *w = t->snap.writer;
    const uint64_t t0 = dt_now_ns();
    const char *prev = w ? wait_copy(w) : NULL;
    t->snap.wait_ns += dt_now_ns() - t0;
    if (w) report_saved(t, w);
    if (dt_strategy_before_save(&t->S)) return -1;
    if (!w) return 0;
    share s;
    choose(t, &s);
    if (dt_optimizer_settle(&t->opt, SIZE_MAX, ERR(t))) return -1;
    const uint64_t o0 = dt_now_ns();
    if (!w->slots && open_slots(t, w, &s)) return -1;
    t->snap.open_ns += dt_now_ns() - o0;
    const dt_ckpt_state st = dt_run_ckpt_state(t);
    const uint64_t b0 = dt_trace_now();
    if (dt_ckpt_slots_begin(w->slots, &t->opt, &st, save ? t->cfg->out_dir : NULL, prev,
                            ERR(t)))
        return -1;
    dt_trace_add(DT_TRACE_COMPUTE, "snapshot_begin", b0, dt_trace_now(), NULL);
    w->keep = t->cfg->keep_last;
    if (t->S.refreshes_params) {
        run_job(w);
        return 0;
    }
    pthread_mutex_lock(&w->mu);
    w->failed = 0;
    w->copied = 0;
    w->pending = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

int dt_run_snapshot_settle(dt_run *t)
{
    const char *prev = t->snap.writer ? wait_copy(t->snap.writer) : NULL;
    return prev ? (dt_strf(ERR(t), "snapshot: %s", prev), -1) : 0;
}

int dt_run_snapshot_writer_end(dt_run *t, int abandon)
{
    dt_snap_writer *w = t->snap.writer;
    if (!w) return 0;
    t->snap.writer = NULL;
    t->r.before_update = NULL;
    pthread_mutex_lock(&w->mu);
    if (abandon) atomic_store(&w->abandon, 1);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    const uint64_t t0 = dt_now_ns();
    pthread_join(w->thread, NULL);
    if (!abandon) report_saved(t, w);
    if (!abandon) { /* the run's last snapshot: the training thread waits for it */
        t->snap.wait_ns += dt_now_ns() - t0;
        t->snap.write_ns += dt_now_ns() - t0;
    }
    int rc = 0;
    if (w->failed && !abandon) rc = (dt_strf(ERR(t), "snapshot: %s", w->err), -1);
    t->snap.bg_ns += w->write_ns;
    t->snap.bg_count += w->writes;
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    dt_ckpt_slots_close(w->slots);
    free(w);
    return rc;
}
