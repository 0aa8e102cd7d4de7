/* In-memory snapshots written in the background (snapshots.c decides when):
 * at the snapshot point the training thread copies this rank's state into
 * a staging buffer (allocated once, counted as "other" memory) and does
 * whatever is collective; one thread per rank then writes the snapshot's
 * files from that copy with the checkpoints' writers while the next steps
 * run, without a call to the communicator (the training thread owns it).
 *
 * The handoff: the staging buffer and the job belong to the training
 * thread while `pending` is 0 and to the writer while it is 1; `pending`
 * changes only under the mutex, so each side's writes happen before the
 * other side reads them. The training thread waits for pending == 0
 * before it stages the next snapshot.
 *
 * The optimizer state on NVMe (t->opt.store) is not staged: it is mapped
 * from its store only around a save, and a copy would be the size of the
 * state the offload keeps out of memory. Those runs snapshot
 * synchronously (dt_run_snapshot_stage returns 1). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "train/ckpt/checkpoint.h"
#include "train/ckpt/shard.h"
#include "train/run.h"

typedef struct dt_snap_writer {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, quit;
    atomic_int abandon;
    /* The staged state: the training thread's while !pending. */
    float *buf; /* params, m, v, moe bias, one allocation */
    size_t nparams, nmoments, nbias;
    dt_gpt model; /* the whole-model case: the layout, params pointing into buf */
    dt_optimizer opt;
    dt_ckpt_state st;
    const dt_flat_ranges *mine; /* the sharded case */
    dt_flat_ranges in_file;
    dt_flat_range *in_file_tmp;
    dt_ckpt_async *async;
    long keep;
    char dir[256];
    /* The last write's result: the writer's while pending. */
    int failed;
    char err[1024];
    uint64_t write_ns;
    long writes;
} dt_snap_writer;

/* For the test of a rank killed while a snapshot is written:
 * DTRAIN_SNAPSHOT_TEST_WRITE_MS holds each write of the job's first
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

static int write_job(dt_snap_writer *w)
{
    test_delay();
    if (w->async)
        return dt_ckpt_async_write(w->async, w->keep, &w->abandon, w->err, sizeof w->err);
    if (atomic_load(&w->abandon)) return 0;
    return dt_ckpt_save(w->dir, &w->model, &w->opt, &w->st, w->keep, NULL, 0, w->err,
                        sizeof w->err);
}

static void *writer_main(void *arg)
{
    dt_snap_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->pending && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->pending) break;
        pthread_mutex_unlock(&w->mu);
        const uint64_t t0 = dt_now_ns();
        const int rc = write_job(w);
        const uint64_t took = dt_now_ns() - t0;
        pthread_mutex_lock(&w->mu);
        w->failed = rc != 0;
        w->write_ns += took;
        w->writes++;
        w->pending = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Waits for the previous write; its failure's message, or NULL. */
static const char *wait_previous(dt_snap_writer *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->pending) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    return w->failed ? w->err : NULL;
}

/* The writer and its staging memory, on the first snapshot. */
static dt_snap_writer *start(dt_run *t, const dt_flat_ranges *mine)
{
    dt_snap_writer *w = calloc(1, sizeof *w);
    if (!w) return dt_strf(ERR(t), "snapshots: out of memory"), NULL;
    w->mine = mine;
    w->nparams = mine ? mine->len : t->model.n_floats;
    w->nmoments = t->opt.m ? t->opt.n : 0;
    w->nbias = t->model.moe.bias ? (size_t)t->model.cfg.n_layer * t->model.cfg.moe.experts : 0;
    const size_t n = w->nparams + (t->opt.v ? 2 : 1) * w->nmoments + w->nbias;
    w->buf = dt_alloc(n * sizeof(float), DT_MEM_OTHER);
    int rc = w->buf ? 0 : (dt_strf(ERR(t), "snapshots: no memory to stage %.1f MiB of this "
                                   "rank's state (--snapshot-every 0 turns snapshots off)",
                                   (double)n * 4.0 / 1048576.0), -1);
    if (rc == 0 && mine) rc = dt_run_file_ranges(t, mine, &w->in_file, &w->in_file_tmp);
    if (rc == 0 && pthread_mutex_init(&w->mu, NULL) == 0) {
        if (pthread_cond_init(&w->cv, NULL) == 0) {
            if (pthread_create(&w->thread, NULL, writer_main, w) == 0) return w;
            pthread_cond_destroy(&w->cv);
        }
        pthread_mutex_destroy(&w->mu);
        dt_strf(ERR(t), "snapshots: cannot start the writer thread");
    }
    dt_free(w->buf);
    free(w->in_file_tmp);
    free(w);
    return NULL;
}

/* Copies of the ranges of src (`at` indexing both) into dst. */
static void copy_ranges(float *dst, const float *src, const dt_flat_ranges *r, int by_lo)
{
    for (int i = 0; i < r->n; i++)
        memcpy(dst + r->r[i].at, src + (by_lo ? r->r[i].lo : r->r[i].at),
               (r->r[i].hi - r->r[i].lo) * sizeof(float));
}

/* This rank's state into the staging buffer: what its save would write. */
static void stage(dt_run *t, dt_snap_writer *w)
{
    float *params = w->buf, *m = params + w->nparams, *v = m + w->nmoments;
    float *bias = v + (t->opt.v ? w->nmoments : 0);
    if (!w->mine) {
        memcpy(params, t->model.params, w->nparams * sizeof(float));
        if (t->opt.m) memcpy(m, t->opt.m, w->nmoments * sizeof(float));
        if (t->opt.v) memcpy(v, t->opt.v, w->nmoments * sizeof(float));
    } else {
        float *pieces = dt_strategy_pieces(&t->S);
        copy_ranges(params, pieces ? pieces : t->model.params, w->mine, !pieces);
        if (t->opt.m) copy_ranges(m, t->opt.m, w->mine, 0);
        if (t->opt.v) copy_ranges(v, t->opt.v, w->mine, 0);
    }
    if (w->nbias) memcpy(bias, t->model.moe.bias, w->nbias * sizeof(float));
    w->model = t->model; /* the layout's tables, read alike by both threads, never written */
    w->model.params = params;
    w->opt = t->opt;
    w->opt.m = t->opt.m ? m : NULL;
    w->opt.v = t->opt.v ? v : NULL;
    w->st = dt_run_ckpt_state(t);
    w->st.moe_bias = w->nbias ? bias : NULL;
}

/* Whether this rank stages snapshots: it writes some, and not from the
 * optimizer's store. */
static int stages(const dt_run *t, const dt_flat_ranges *mine)
{
    return !t->opt.store && (t->S.writes_checkpoints || mine);
}

int dt_run_snapshot_writer_start(dt_run *t)
{
    const dt_flat_ranges *mine = t->S.saves ? t->S.saves : t->S.shard;
    if (t->snap.writer || !stages(t, mine)) return 0;
    return (t->snap.writer = start(t, mine)) ? 0 : -1;
}

int dt_run_snapshot_stage(dt_run *t)
{
    if (t->opt.store) return 1;
    const dt_flat_ranges *mine = t->S.saves ? t->S.saves : t->S.shard;
    dt_snap_writer *w = t->snap.writer;
    const uint64_t t0 = dt_now_ns();
    const char *prev = w ? wait_previous(w) : NULL;
    t->snap.wait_ns += dt_now_ns() - t0;
    /* The whole model's writer alone reports its failure; the sharded
     * save's begin tells every rank. */
    if (prev && !mine) return dt_strf(ERR(t), "snapshot: %s", prev), -1;
    if (dt_strategy_before_save(&t->S)) return -1;
    if (!stages(t, mine)) return 0;
    if (!w && !(w = t->snap.writer = start(t, mine))) return -1;
    if (dt_optimizer_settle(&t->opt, SIZE_MAX, ERR(t))) return -1;
    stage(t, w);
    w->keep = 1;
    snprintf(w->dir, sizeof w->dir, "%s", t->snap.dir);
    if (mine && dt_ckpt_async_begin(&w->async, w->dir, dt_run_file_layout(t), &w->in_file,
                                    w->model.params, &w->opt, &w->st, t->cfg->zero_stage,
                                    t->S.save_group ? t->S.save_group : t->S.lockstep, prev,
                                    ERR(t)))
        return -1;
    pthread_mutex_lock(&w->mu);
    w->failed = 0;
    w->pending = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

int dt_run_snapshot_settle(dt_run *t)
{
    const char *prev = t->snap.writer ? wait_previous(t->snap.writer) : NULL;
    return prev ? (dt_strf(ERR(t), "snapshot: %s", prev), -1) : 0;
}

int dt_run_snapshot_writer_end(dt_run *t, int abandon)
{
    dt_snap_writer *w = t->snap.writer;
    if (!w) return 0;
    t->snap.writer = NULL;
    pthread_mutex_lock(&w->mu);
    if (abandon) atomic_store(&w->abandon, 1);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    const uint64_t t0 = dt_now_ns();
    pthread_join(w->thread, NULL);
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
    dt_ckpt_async_free(w->async);
    free(w->in_file_tmp);
    dt_free(w->buf);
    free(w);
    return rc;
}
