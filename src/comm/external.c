/*
 * Joining a job through the caller's key-value store
 * (dt_comm_init_external): for a framework that ran its own rendezvous,
 * such as PyTorch's c10d store, and that may make several communicators
 * in one process, one per process group, each its own job.
 *
 * The job is made as dt_comm_init makes one (dt_job_new), from what the
 * caller says instead of a launcher's environment; its store is the
 * caller's (dt_store_external). Rank 0 makes the job's secret, which
 * authenticates the TCP links, and tells it through the store; the job id
 * that names the shared-memory segments follows from it. The world
 * communicator is then set up exactly as dt_comm_init's (comm.c), while a
 * watcher stands in for the control channel (external_watch.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap/identity.h"
#include "comm/bootstrap/store.h"
#include "comm/comm_internal.h"
#include "comm/external.h"
#include "core/env.h"
#include "core/timer.h"

#define WHAT "dt_comm_init_external"

static const char joined_key[] = "dtrain/joined";
static const char secret_key[] = "dtrain/secret";

static int check_args(const dt_kv_ops *ops, int rank, int size, char *err, size_t len)
{
    if (!ops || !ops->set || !ops->get || !ops->add)
        snprintf(err, len, "the store's callbacks are missing (set, get and add are needed)");
    else if (size < 1 || size > DT_MAX_WORLD_SIZE)
        snprintf(err, len, "size %d is not between 1 and %d", size, DT_MAX_WORLD_SIZE);
    else if (rank < 0 || rank >= size)
        snprintf(err, len, "rank %d is not between 0 and size - 1 = %d", rank, size - 1);
    else
        return 0;
    return DT_ERR_INVALID;
}

/* What dt_job_new needs: the caller's rank, size and timeout, and from
 * the environment the transport and the address that routes to rank 0's
 * host (which picks the address we advertise to peers). */
static int bootstrap_of(int rank, int size, double timeout_s, dt_bootstrap *b, char *err,
                        size_t len)
{
    memset(b, 0, sizeof *b);
    b->rank = rank;
    b->size = size;
    b->local_rank = b->local_size = -1;
    b->port_hold = -1;
    snprintf(b->launcher, sizeof b->launcher, "external");
    if (dt_bootstrap_read_settings(b, err, len) < 0) return DT_ERR_INVALID;
    if (b->use_mpi) {
        snprintf(err, len, "DTRAIN_TRANSPORT=mpi needs dt_comm_init under mpirun; a "
                 "communicator joined through the caller's store runs on shm and tcp (set "
                 "DTRAIN_TRANSPORT to auto, shm or tcp)");
        return DT_ERR_INVALID;
    }
    if (timeout_s > 0 && !dt_env_str("DTRAIN_TIMEOUT")) b->timeout_s = timeout_s;
    const char *master = dt_env_str("MASTER_ADDR");
    snprintf(b->master_addr, sizeof b->master_addr, "%s", master ? master : "127.0.0.1");
    b->master_port = 29500; /* any port: the route does not depend on it */
    return 0;
}

/* Each rank counts itself in: a count past size means the store already
 * served a communicator, whose keys would be read as this one's. */
static int count_in(dt_job *job, char *err, size_t len)
{
    char e[512];
    int64_t arrived = 0;
    int rc = dt_kv_add(job->kv, job->kv_ctx, joined_key, 1, &arrived, e, sizeof e);
    if (rc < 0) {
        snprintf(err, len, "rank %d could not use the store: %s", job->rank, e);
        return rc;
    }
    if (arrived <= job->size) return 0;
    snprintf(err, len, "the store already served an earlier dtrain communicator (%" PRId64
             " ranks joined through it, this communicator has %d): give each communicator a "
             "fresh store, or keys under a prefix of its own", arrived, job->size);
    return DT_ERR_INVALID;
}

static int share_secret(dt_job *job, char *err, size_t len)
{
    char e[512];
    int rc;
    if (job->rank == 0) {
        if (dt_ident_random_secret(job->secret, sizeof job->secret) < 0) {
            snprintf(err, len, "no random secret for the job: %s", strerror(errno));
            return DT_ERR_SYSTEM;
        }
        rc = dt_kv_set(job->kv, job->kv_ctx, secret_key, job->secret, strlen(job->secret), e,
                       sizeof e);
    } else {
        void *val = NULL;
        size_t n = 0;
        uint64_t deadline = dt_now_ns() + (uint64_t)(job->timeout_s * 1e9);
        rc = dt_kv_get(job->kv, job->kv_ctx, secret_key, &val, &n, deadline, job->wake_fd, e,
                       sizeof e);
        if (rc == 0)
            snprintf(job->secret, sizeof job->secret, "%.*s",
                     (int)(n < sizeof job->secret ? n : sizeof job->secret - 1),
                     (const char *)val);
        free(val);
    }
    if (rc < 0) {
        snprintf(err, len, "rank %d could not %s: %s", job->rank,
                 job->rank == 0 ? "publish the job's secret" : "read the job's secret from rank 0",
                 e);
        return rc;
    }
    dt_ident_job_id(job->secret, "external", job->size, job->job_id, sizeof job->job_id);
    return 0;
}

static int new_job(const dt_kv_ops *ops, void *ctx, const dt_bootstrap *b, dt_job **out)
{
    int rc = dt_job_new(b, out);
    if (rc < 0) return rc;
    dt_job *job = *out;
    job->kv = ops;
    job->kv_ctx = ctx;
    job->exited = calloc((size_t)b->size, sizeof *job->exited);
    if (!job->exited) return DT_ERR_NOMEM;
    rc = dt_store_external(ops, ctx, &job->store);
    if (rc == 0) dt_store_set_abort_fd(job->store, job->wake_fd);
    return rc;
}

int dt_comm_init_external(const dt_kv_ops *ops, void *ctx, int rank, int size, double timeout_s,
                          dt_comm **out)
{
    char err[768] = "";
    if (!out) return DT_ERR_INVALID;
    *out = NULL;
    dt_bootstrap b;
    dt_job *job = NULL;
    int rc = check_args(ops, rank, size, err, sizeof err);
    if (rc == 0) rc = bootstrap_of(rank, size, timeout_s, &b, err, sizeof err);
    if (rc == 0) rc = new_job(ops, ctx, &b, &job);
    if (rc == 0 && size > 1) rc = count_in(job, err, sizeof err);
    if (rc == 0 && (rc = dt_ext_watch_start(job)) < 0)
        snprintf(err, sizeof err, "cannot start the watcher thread");
    if (rc == 0 && size > 1) rc = share_secret(job, err, sizeof err);
    if (rc < 0) return dt_comm_init_failed(job, rc, WHAT, err);
    dt_comm *c = NULL;
    if ((rc = dt_comm_world_init(job, WHAT, &c)) < 0) return rc;
    dt_ext_watch_peers(job, c);
    *out = c;
    return 0;
}
