/*
 * Failure handling. A failure anywhere fails the whole job: the first rank
 * to see it tells the store, the store tells every rank, and every pending
 * or later call returns an error whose message names the collective, its
 * sequence number and the peer. (A job joined through the caller's store
 * tells it through that store instead, and its watcher hears it:
 * external_watch.c.)
 *
 * For a timeout the local view can blame the wrong rank (in a ring, every
 * rank waits on its left neighbour, only one of which is the stopped
 * process), so after reporting we wait briefly for the store's verdict,
 * which looks at heartbeats to find the rank that is really stuck.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "comm/external.h"
#include "comm/mpi.h"
#include "comm/bootstrap/store.h"
#include "core/log.h"
#include "core/str.h"
#include "core/timer.h"

#define VERDICT_WAIT_S 2.0

/* Every communicator's waiter, from its doorbell (job->lock held). */
static void wake_comms(dt_job *job)
{
    for (int i = 0; i < job->ncomms; i++) job->comms[i]->doorbell->wake(job->comms[i]);
}

static void wake_all(dt_job *job)
{
    uint64_t one = 1;
    if (job->wake_fd >= 0 && write(job->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        dt_log(DT_LOG_DEBUG, "waking waiters: %s", strerror(errno));
    wake_comms(job);
}

void dt_job_abort(dt_job *job, int code, const char *msg)
{
    pthread_mutex_lock(&job->lock);
    int first = !atomic_load(&job->aborted);
    if (first) {
        job->abort_code = code;
        snprintf(job->abort_msg, sizeof job->abort_msg, "%s", msg);
        atomic_store(&job->aborted, 1);
        wake_all(job);
    }
    pthread_mutex_unlock(&job->lock);
    if (first) dt_mpi_abort_if_blocked(msg);
}

void dt_job_note_left(dt_job *job, int rank)
{
    if (rank < 0 || rank >= job->size) return;
    uint64_t none = 0;
    if (!atomic_compare_exchange_strong(&job->left_ns[rank], &none, dt_now_ns())) return;
    atomic_fetch_add(&job->nleft, 1);
    /* A waiter sleeping on its doorbell looks again (TCP and MPI waits
     * wake every slice anyway; the wake fd is for aborts only). */
    pthread_mutex_lock(&job->lock);
    wake_comms(job);
    pthread_mutex_unlock(&job->lock);
}

int dt_comm_peer_left(dt_comm *c, int peer, double wait_s)
{
    dt_job *job = c->job;
    double until = dt_now_s() + wait_s;
    for (;;) {
        if (atomic_load(&job->left_ns[c->world_rank[peer]])) return 1;
        if (atomic_load(&job->aborted) || dt_now_s() >= until) return 0;
        usleep(5000);
    }
}

int dt_comm_fail_left(dt_comm *c, const dt_p2p *op, const char *also)
{
    char who[64];
    int w = c->world_rank[op->peer];
    if (w == op->peer)
        snprintf(who, sizeof who, "rank %d", op->peer);
    else
        snprintf(who, sizeof who, "rank %d (rank %d of the job)", op->peer, w);
    const char *what = op->kind == DT_P2P_SEND ? "to take our send" : "to send";
    if (c->job->exited && atomic_load(&c->job->exited[w]))
        return dt_comm_fail(c, DT_ERR_PEER, op->peer,
                            "%s's process ended (crashed, killed or exited) while this rank "
                            "still waited for it %s%s",
                            who, what, also);
    return dt_comm_fail(c, DT_ERR_PEER, op->peer,
                        "%s left: it called dt_comm_destroy while this rank still waited for it "
                        "%s%s",
                        who, what, also);
}

/* "allreduce #17 (rank 2 of 4)", plus the communicator when not the world. */
static int describe_call(const dt_comm *c, char *buf, size_t len)
{
    const char *comm = strcmp(c->id, "w") ? c->id : NULL;
    if (c->cur.kind == DT_COLL_NONE)
        return snprintf(buf, len, "rank %d of %d%s%s", c->rank, c->size,
                        comm ? " in communicator " : "", comm ? comm : "");
    if (c->cur.kind == DT_COLL_SEND && c->cur.any_source)
        return snprintf(buf, len, "recv from any rank (rank %d of %d%s%s)", c->rank, c->size,
                        comm ? ", communicator " : "", comm ? comm : "");
    if (c->cur.kind == DT_COLL_SEND)
        return snprintf(buf, len, "%s with rank %d (rank %d of %d%s%s)",
                        c->cur.is_recv ? "recv" : "send", c->cur.root, c->rank, c->size,
                        comm ? ", communicator " : "", comm ? comm : "");
    return snprintf(buf, len, "%s #%llu (rank %d of %d%s%s%s%s)", dt_coll_name(c->cur.kind),
                    (unsigned long long)c->cur_seq, c->rank, c->size,
                    c->cur_step ? ", " : "", c->cur_step ? c->cur_step : "",
                    comm ? ", communicator " : "", comm ? comm : "");
}

int dt_job_report(dt_job *job, int code, int suspect, int is_timeout, const char *msg)
{
    if (job->monitor) {
        dt_monitor_report(job->monitor, code, suspect, is_timeout, msg);
        return 1;
    }
    if (job->kv) {
        dt_ext_report(job, msg);
        return 1;
    }
    return 0;
}

static void wait_for_verdict(dt_job *job)
{
    double until = dt_now_s() + VERDICT_WAIT_S;
    while (!atomic_load(&job->aborted) && dt_now_s() < until) usleep(10000);
}

int dt_comm_fail(dt_comm *c, int code, int peer, const char *fmt, ...)
{
    /* A dry run's stand-in (cost/predict.c) only predicts: whatever it
     * trips over is no failure of the job. */
    if (c->dry) return code;
    char detail[512], where[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    describe_call(c, where, sizeof where);

    dt_job *job = c->job;
    int from_abort = atomic_load(&job->aborted);
    char report[800];
    snprintf(report, sizeof report, "rank %d: %s: %s", job->rank, where, detail);
    if (!from_abort && dt_job_report(job, code, peer >= 0 ? c->world_rank[peer] : -1,
                                     code == DT_ERR_TIMEOUT, report)) {
        /* A timeout or a lost peer is often the echo of a failure elsewhere
         * (a peer that exited because of it); rank 0 must not exit, taking
         * the store with it, before the others heard. Wait for the cause. */
        if (code == DT_ERR_TIMEOUT || code == DT_ERR_PEER || job->server) wait_for_verdict(job);
    }

    pthread_mutex_lock(&c->err_lock);
    if (!atomic_load(&c->failed)) {
        char verdict[600] = "";
        pthread_mutex_lock(&job->lock);
        if (atomic_load(&job->aborted) && !strstr(job->abort_msg, detail) &&
            !strstr(detail, job->abort_msg))
            snprintf(verdict, sizeof verdict, "; the job's verdict: %s", job->abort_msg);
        pthread_mutex_unlock(&job->lock);
        dt_strf(c->err, sizeof c->err, "%s: %s%s", where, detail, verdict);
        c->failed_code = code;
        atomic_store(&c->failed, 1);
    }
    pthread_mutex_unlock(&c->err_lock);

    /* Everything else in this process stops too, whatever the store does. */
    if (!from_abort) dt_job_abort(job, code, c->err);
    return code;
}

int dt_comm_fail_from_abort(dt_comm *c, const char *during)
{
    char msg[512];
    pthread_mutex_lock(&c->job->lock);
    dt_strf(msg, sizeof msg, "%s", c->job->abort_msg);
    int code = c->job->abort_code ? c->job->abort_code : DT_ERR_ABORTED;
    pthread_mutex_unlock(&c->job->lock);
    return dt_comm_fail(c, code, -1, "job aborted%s: %s", during, msg);
}

void dt_comm_abort(dt_comm *c, const char *reason)
{
    if (!c) return;
    dt_job *job = c->job;
    char report[800];
    snprintf(report, sizeof report, "rank %d failed: %s", job->rank, reason ? reason : "");
    if (!atomic_load(&job->aborted) && dt_job_report(job, DT_ERR_ABORTED, -1, 0, report)) {
        /* Rank 0 holds the store: it must not leave before the others heard. */
        if (job->server) wait_for_verdict(job);
    }
    dt_job_abort(job, DT_ERR_ABORTED, report);
}
