/*
 * The job: one per process, made from what the launcher's environment
 * says (bootstrap/), joined to the store that rank 0 (or the launcher)
 * serves and to the control channel that carries heartbeats and aborts,
 * and holding the communicators alive in this process so that an abort
 * can wake them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/store.h"
#include "comm/comm_internal.h"
#include "comm/mpi.h"
#include "comm/topo.h"
#include "comm/transport/net.h"
#include "core/env.h"
#include "core/log.h"
#include "core/timer.h"

/* ---- store access ------------------------------------------------------- */

static int store_call_result(dt_comm *c, int rc, const char *what, const char *key)
{
    if (rc == 0) return 0;
    return dt_comm_fail(c, rc, -1, "store %s of '%s/%s' failed: %s", what, c->id, key,
                        dt_store_error(c->job->store));
}

int dt_comm_store_set(dt_comm *c, const char *key, const void *val, size_t len)
{
    char k[DT_STORE_MAX_KEY];
    snprintf(k, sizeof k, "%s/%s", c->id, key);
    pthread_mutex_lock(&c->job->store_lock);
    int rc = dt_store_set(c->job->store, k, val, len);
    pthread_mutex_unlock(&c->job->store_lock);
    return store_call_result(c, rc, "set", key);
}

int dt_comm_store_get(dt_comm *c, const char *key, void **val, size_t *len)
{
    char k[DT_STORE_MAX_KEY];
    snprintf(k, sizeof k, "%s/%s", c->id, key);
    pthread_mutex_lock(&c->job->store_lock);
    int rc = dt_store_get(c->job->store, k, val, len, dt_comm_deadline(c));
    pthread_mutex_unlock(&c->job->store_lock);
    return store_call_result(c, rc, "get", key);
}

int dt_comm_store_barrier(dt_comm *c, const char *key)
{
    if (c->size == 1) return 0;
    char k[DT_STORE_MAX_KEY];
    snprintf(k, sizeof k, "%s/%s", c->id, key);
    pthread_mutex_lock(&c->job->store_lock);
    int rc = dt_store_barrier(c->job->store, k, c->size, dt_comm_deadline(c));
    pthread_mutex_unlock(&c->job->store_lock);
    return store_call_result(c, rc, "barrier", key);
}

/* ---- job ------------------------------------------------------------------ */

static void on_store_abort(void *arg, int code, const char *msg) { dt_job_abort(arg, code, msg); }
static void on_store_left(void *arg, int rank) { dt_job_note_left(arg, rank); }
static const dt_monitor_events job_events = {on_store_abort, on_store_left};

/* The address peers should use to reach us: the one our kernel would use
 * to reach rank 0. */
static void find_advertise_addr(dt_job *job)
{
    const char *over = dt_env_str("DTRAIN_ADVERTISE_ADDR");
    if (over)
        snprintf(job->advertise_addr, sizeof job->advertise_addr, "%s", over);
    else if (dt_net_route_addr(job->master_addr, job->master_port, job->advertise_addr,
                               sizeof job->advertise_addr) != 0)
        snprintf(job->advertise_addr, sizeof job->advertise_addr, "127.0.0.1");
}

/* The store serves on the port now, or never will. */
static void release_port_hold(dt_job *job)
{
    if (job->port_hold >= 0) close(job->port_hold);
    job->port_hold = -1;
}

void dt_job_free(dt_job *job)
{
    if (!job) return;
    if (job->wake_fd >= 0) close(job->wake_fd);
    release_port_hold(job);
    free(job->comms);
    free(job->left_ns);
    free(job->exited);
    pthread_mutex_destroy(&job->lock);
    pthread_mutex_destroy(&job->store_lock);
    free(job);
}

/* Without DTRAIN_SECRET, a launcher other than ours gives no secret, and
 * the one derived from its job id and the store's address can be guessed
 * by anyone on these machines. Said once, by rank 0. */
static void warn_guessable_secret(const dt_bootstrap *b)
{
    const char *by = !strcmp(b->launcher, "openmpi") ? "mpirun"
                     : !strcmp(b->launcher, "slurm") ? "srun"
                     : !strcmp(b->launcher, "pmi")   ? "the PMI launcher"
                                                     : b->launcher;
    DT_WARN("this job runs on a secret that others can guess (DTRAIN_SECRET is not set, and %s "
            "made none): any user of these machines could join it as a rank. Start it with "
            "`dtrain launch`, or give every rank the same random secret, for example "
            "export DTRAIN_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')",
            by);
}

int dt_job_new(const dt_bootstrap *b, dt_job **out)
{
    dt_job *job = calloc(1, sizeof *job);
    if (job) job->left_ns = calloc((size_t)b->size, sizeof *job->left_ns);
    if (!job || !job->left_ns) {
        free(job);
        return DT_ERR_NOMEM;
    }
    pthread_mutex_init(&job->lock, NULL);
    pthread_mutex_init(&job->store_lock, NULL);
    job->rank = b->rank;
    job->size = b->size;
    job->local_rank = b->local_rank;
    job->local_size = b->local_size;
    snprintf(job->launcher, sizeof job->launcher, "%s", b->launcher);
    snprintf(job->master_addr, sizeof job->master_addr, "%s", b->master_addr);
    job->master_port = b->master_port;
    snprintf(job->secret, sizeof job->secret, "%s", b->secret);
    snprintf(job->job_id, sizeof job->job_id, "%s", b->job_id);
    job->timeout_s = b->timeout_s;
    job->force_tcp = b->force_tcp;
    job->use_mpi = b->use_mpi;
    job->store_by_launcher = b->store_by_launcher;
    job->port_hold = b->port_hold;
    if (job->store_by_launcher) dt_store_set_server_name("node 0's launcher");
    dt_cost_model_defaults(&job->model);
    job->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    dt_topo_read_host(job);
    find_advertise_addr(job);
    *out = job;
    return 0;
}

int dt_job_create(dt_job **out, char *err, size_t errlen)
{
    dt_bootstrap b;
    if (dt_bootstrap_from_env(&b, err, errlen) < 0) return DT_ERR_INVALID;
    int rc = dt_mpi_job_init(&b, err, errlen); /* under mpirun: MPI up, rank 0's store address */
    if (rc == 0) rc = dt_job_new(&b, out);
    if (rc < 0) {
        if (b.port_hold >= 0) close(b.port_hold); /* the job that would release it is not */
        return rc;
    }
    dt_log_set_rank(b.rank);
    if (!b.secret_from_env && b.size > 1 && b.rank == 0) warn_guessable_secret(&b);
    return 0;
}

/* Rank 0 serves the store, unless the launcher does (so that the store
 * outlives every rank of a job that restarts); everyone connects to it and
 * opens the control channel that carries heartbeats and aborts. */
int dt_job_connect(dt_job *job, char *err, size_t errlen)
{
    uint64_t deadline = dt_now_ns() + (uint64_t)(job->timeout_s * 1e9);
    double hb_timeout = job->timeout_s;
    char e[256];
    if (dt_env_double("DTRAIN_HEARTBEAT_TIMEOUT", 0.1, 1e7, &hb_timeout, e, sizeof e) < 0) {
        snprintf(err, errlen, "%s", e);
        return DT_ERR_INVALID;
    }
    double interval = hb_timeout / 4 < 1.0 ? hb_timeout / 4 : 1.0;
    int rc = 0;
    if (job->rank == 0 && !job->store_by_launcher)
        rc = dt_store_server_start(job->master_addr, job->master_port, job->size, job->secret,
                                   hb_timeout, &job->server, e, sizeof e);
    release_port_hold(job);
    if (rc < 0) {
        snprintf(err, errlen, "rank 0 could not serve the store on port %d (MASTER_PORT): %s",
                 job->master_port, e);
        return rc;
    }
    if ((rc = dt_store_connect(job->master_addr, job->master_port, job->secret, deadline,
                               &job->store, e, sizeof e)) < 0) {
        snprintf(err, errlen, "rank %d could not reach the store at %s:%d: %s", job->rank,
                 job->master_addr, job->master_port, e);
        return rc;
    }
    dt_store_set_abort_fd(job->store, job->wake_fd);
    if ((rc = dt_monitor_start(job->master_addr, job->master_port, job->rank, job->secret,
                               interval, deadline, &job_events, job, &job->monitor, e,
                               sizeof e)) < 0) {
        snprintf(err, errlen, "rank %d could not open the control channel: %s", job->rank, e);
        return rc;
    }
    return 0;
}

void dt_job_leave(dt_job *job)
{
    if (job->monitor) dt_monitor_stop(job->monitor); /* says BYE */
    job->monitor = NULL;
}

void dt_job_disconnect(dt_job *job)
{
    dt_job_leave(job);
    if (job->store) dt_store_close(job->store);
    if (job->server)
        dt_store_server_stop(job->server, dt_now_ns() + (uint64_t)(job->timeout_s * 1e9));
    job->store = NULL;
    job->server = NULL;
}

int dt_job_register(dt_job *job, dt_comm *c)
{
    pthread_mutex_lock(&job->lock);
    if (job->ncomms == job->comms_cap) {
        int cap = job->comms_cap ? 2 * job->comms_cap : 8;
        dt_comm **p = realloc(job->comms, (size_t)cap * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&job->lock);
            return DT_ERR_NOMEM;
        }
        job->comms = p;
        job->comms_cap = cap;
    }
    job->comms[job->ncomms++] = c;
    pthread_mutex_unlock(&job->lock);
    return 0;
}

void dt_job_unregister(dt_job *job, dt_comm *c)
{
    pthread_mutex_lock(&job->lock);
    for (int i = 0; i < job->ncomms; i++)
        if (job->comms[i] == c) job->comms[i] = job->comms[--job->ncomms];
    pthread_mutex_unlock(&job->lock);
}

