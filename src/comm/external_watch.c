/*
 * The watcher of a job joined through the caller's store: what the
 * control channel does for dtrain's own jobs (bootstrap/monitor.c), as far
 * as a plain key-value store allows. It has no heartbeats, so a process
 * that stops without dying is found only by the timeout. Every tick it:
 *
 *  - reads the store's failure counter (dt_kv_poll_abort): a failure any
 *    rank published aborts this rank's job, with the first report's
 *    message, as the store server's ABORT does;
 *  - looks whether the process of each peer that shares memory with us
 *    still exists: one that ended is noted as gone, so that an operation
 *    waiting on it fails within a second, naming it (a peer over TCP is
 *    noticed by its closed connection instead).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/bootstrap/store.h"
#include "comm/external.h"
#include "comm/transport/shm.h"
#include "core/log.h"

#define WATCH_TICK_MS 100

struct dt_ext_watch {
    dt_job *job;
    int *pids; /* [size]: the process of each peer that shares memory with us, else 0 */
    int store_quiet; /* the store stopped answering (its owner ended): no more polls */
    int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
};

/* Whether process pid has ended: gone, or a zombie not yet reaped. */
static int process_ended(int pid)
{
    if (kill(pid, 0) < 0 && errno == ESRCH) return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *end = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    return end && end[1] == ' ' && end[2] == 'Z';
}

static void check_peers(struct dt_ext_watch *w)
{
    dt_job *job = w->job;
    for (int r = 0; r < job->size; r++) {
        if (!w->pids[r] || atomic_load(&job->exited[r]) || !process_ended(w->pids[r])) continue;
        DT_DEBUG("rank %d's process (pid %d) ended", r, w->pids[r]);
        atomic_store(&job->exited[r], 1);
        dt_job_note_left(job, r);
    }
}

static void check_store(struct dt_ext_watch *w)
{
    dt_job *job = w->job;
    if (w->store_quiet || atomic_load(&job->aborted)) return;
    char msg[512], err[512];
    pthread_mutex_lock(&job->store_lock);
    int rc = dt_kv_poll_abort(job->kv, job->kv_ctx, msg, sizeof msg, err, sizeof err);
    pthread_mutex_unlock(&job->store_lock);
    if (rc == 1) {
        dt_job_abort(job, DT_ERR_ABORTED, msg);
    } else if (rc < 0) {
        /* Usually the end of the job: the store's owner left before us. */
        DT_DEBUG("the store no longer answers (%s); failures are no longer heard through it",
                 err);
        w->store_quiet = 1;
    }
}

static void *watch_main(void *arg)
{
    struct dt_ext_watch *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        check_peers(w); /* under w->mu: the pids arrive once the links exist */
        pthread_mutex_unlock(&w->mu);
        check_store(w);
        pthread_mutex_lock(&w->mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCH_TICK_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        if (!w->stop) pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void watch_free(struct dt_ext_watch *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->pids);
    free(w);
}

int dt_ext_watch_start(dt_job *job)
{
    struct dt_ext_watch *w = calloc(1, sizeof *w);
    if (w) w->pids = calloc((size_t)job->size, sizeof *w->pids);
    if (!w || !w->pids) {
        free(w);
        return DT_ERR_NOMEM;
    }
    w->job = job;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
        watch_free(w);
        return DT_ERR_SYSTEM;
    }
    job->watch = w;
    return 0;
}

void dt_ext_watch_peers(dt_job *job, dt_comm *world)
{
    struct dt_ext_watch *w = job->watch;
    pthread_mutex_lock(&w->mu);
    /* A peer whose process we cannot see now (another pid namespace)
     * is not watched: its pid would name some other process. */
    for (int r = 0; r < job->size; r++) {
        int pid = dt_shm_peer_pid(world, r);
        if (pid > 0 && (kill(pid, 0) == 0 || errno == EPERM)) w->pids[r] = pid;
    }
    pthread_mutex_unlock(&w->mu);
}

void dt_ext_leave(dt_job *job)
{
    struct dt_ext_watch *w = job->watch;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    watch_free(w);
    job->watch = NULL;
}

void dt_ext_report(dt_job *job, const char *msg)
{
    char err[512];
    pthread_mutex_lock(&job->store_lock);
    int rc = dt_kv_publish_abort(job->kv, job->kv_ctx, msg, err, sizeof err);
    pthread_mutex_unlock(&job->store_lock);
    if (rc < 0) DT_WARN("could not tell the other ranks of this failure: %s", err);
}
