/*
 * Communicator lifecycle: joining the job (job.c), finding where the
 * members run (topo.c), linking them (transport/), splitting into
 * sub-communicators, and tearing down.
 *
 * Each communicator has its own links (shared-memory rings or TCP
 * connections), so collectives on different communicators never share a
 * message stream and can run in any order on different threads.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/algo/algorithms.h"
#include "comm/async.h"
#include "comm/bootstrap/store.h"
#include "comm/comm_internal.h"
#include "comm/external.h"
#include "comm/mpi.h"
#include "comm/topo.h"
#include "comm/transport/transport.h"
#include "core/alloc.h"
#include "core/env.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/str.h"
#include "core/timer.h"

/* Per thread: communicators of external jobs may start on several at once. */
static _Thread_local char last_error[1024];
static dt_job *the_job; /* one job per process */

const char *dt_last_error(void) { return last_error; }

/* The communicator's tag in every message header: its id, folded. */
static uint32_t id_tag(const char *id)
{
    uint64_t h = dt_fnv1a64_str(id);
    return (uint32_t)(h ^ (h >> 32));
}

uint64_t dt_comm_deadline(const dt_comm *c)
{
    return dt_now_ns() + (uint64_t)(c->job->timeout_s * 1e9);
}

/* ---- communicator --------------------------------------------------------- */

/* How a wait starts (p2p.c): spin, then (with more ranks than cores)
 * yield the core, then sleep. A crowded machine spins only a few polls:
 * the yield that follows hands the core to a rank on it, and a longer spin
 * only delays that (4 ranks on 2 cores, 4 KiB all-to-all-v: 6.0 us with
 * 10 polls, 8.0 with 50). Crowded counts the ranks on this kernel, not on
 * this host name: ranks posing as hosts on one machine share its cores
 * (4 ranks as 2 hosts of 2 on 2 cores, every collective algorithm: 31 s
 * spinning 4000 polls, each a recvmsg on the TCP links, against 6 s). */
static void set_waiting(dt_comm *c, int ranks_on_host)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int crowded = (c->kernel_ranks > ranks_on_host ? c->kernel_ranks : ranks_on_host) > cpus;
    long spin = crowded ? 10 : 4000;
    char e[256];
    int set = dt_env_long("DTRAIN_SPIN", 0, 100000000, &spin, e, sizeof e);
    if (set < 0) DT_WARN("%s", e);
    c->spin_limit = (int)spin;
    c->spin_ns = set > 0 ? UINT64_MAX : DT_SPIN_NS; /* a count asked for is spun in full */
    c->yield_ns = crowded ? DT_YIELD_NS : 0;
}

static dt_comm *comm_alloc(dt_job *job, const char *id, int rank, int size)
{
    dt_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->job = job;
    snprintf(c->id, sizeof c->id, "%s", id);
    c->tag = id_tag(id);
    c->rank = rank;
    c->size = size;
    c->world_rank = calloc((size_t)size, sizeof *c->world_rank);
    c->host_of = calloc((size_t)size, sizeof *c->host_of);
    c->links = calloc((size_t)size, sizeof *c->links);
    c->doorbell = dt_transports_doorbell();
    c->p2p_send_seq = calloc((size_t)size, sizeof *c->p2p_send_seq);
    c->p2p_recv_seq = calloc((size_t)size, sizeof *c->p2p_recv_seq);
    c->queue = dt_p2p_queue_new(size);
    c->p2p_queue_limit = (size_t)DT_P2P_QUEUE_MB << 20;
    pthread_mutex_init(&c->err_lock, NULL);
    for (int k = 0; k < DT_COLL_KIND_COUNT; k++) c->algo_forced[k] = DT_ALGO_AUTO;
    c->model_seen = ~0u; /* auto's choices are made on first use */
    c->async = dt_async_create();
    if (!c->world_rank || !c->host_of || !c->links || !c->p2p_send_seq || !c->p2p_recv_seq ||
        !c->queue || !c->async) {
        dt_comm_destroy(c);
        return NULL;
    }
    return c;
}

static void comm_free(dt_comm *c)
{
    dt_transports_close(c);
    dt_async_destroy(c->async);
    dt_mpi_comm_release(c->mpi);
    dt_free(c->scratch);
    free(c->world_rank);
    free(c->host_of);
    free(c->links);
    free(c->p2p_send_seq);
    free(c->p2p_recv_seq);
    dt_p2p_queue_free(c->queue);
    pthread_mutex_destroy(&c->err_lock);
    free(c);
}

/* Where the members are, then links to each of them. */
static int comm_connect(dt_comm *c)
{
    dt_topo_layout(c);
    return dt_transports_connect(c);
}

/* What point-to-point messages that came before their receive may hold
 * (p2p_match.c): DTRAIN_P2P_QUEUE_MB, the same for every communicator of
 * the job. */
static int read_queue_limit(dt_comm *c, char *err, size_t len)
{
    long mb = DT_P2P_QUEUE_MB;
    if (dt_env_long("DTRAIN_P2P_QUEUE_MB", 0, 1L << 30, &mb, err, len) < 0)
        return DT_ERR_INVALID;
    c->p2p_queue_limit = (size_t)mb << 20;
    return 0;
}

/* Rank 0's model (DTRAIN_COMM_MODEL, or the defaults) becomes everyone's,
 * so that auto picks the same algorithm on every rank. */
static int share_cost_model(dt_comm *c, char *err, size_t len)
{
    dt_job *job = c->job;
    const char *path = dt_env_str("DTRAIN_COMM_MODEL");
    if (c->rank == 0) {
        /* A bad file fails every rank at once: the others get its message
         * in place of the model rather than waiting for one. */
        int bad = path && dt_cost_model_load(&job->model, path, err, len) < 0;
        int rc = 0;
        if (c->size > 1 && bad) {
            char msg[800];
            int k = snprintf(msg, sizeof msg, "!rank 0: %s", err);
            rc = dt_comm_store_set(c, "cost_model", msg, (size_t)(k < (int)sizeof msg ? k : (int)sizeof msg - 1));
        } else if (c->size > 1) {
            rc = dt_comm_store_set(c, "cost_model", &job->model, sizeof job->model);
        }
        return bad ? DT_ERR_INVALID : rc;
    }
    void *val = NULL;
    size_t n = 0;
    int rc = dt_comm_store_get(c, "cost_model", &val, &n);
    if (rc == 0 && n > 0 && ((char *)val)[0] == '!') {
        snprintf(err, len, "%.*s", (int)(n - 1), (char *)val + 1);
        rc = DT_ERR_INVALID;
    } else if (rc == 0 && n == sizeof job->model) {
        memcpy(&job->model, val, n);
    } else if (rc == 0) {
        rc = dt_comm_fail(c, DT_ERR_PROTOCOL, 0, "rank 0's cost model has %zu bytes, ours %zu "
                          "(different dtrain builds?)", n, sizeof job->model);
    }
    free(val);
    return rc;
}

/* A failed start: the message into last_error (the first failure's, when
 * another rank's abort came first), told to the other ranks, and
 * everything made so far freed. Returns rc. */
static int init_failed(dt_job *job, dt_comm *c, int rc, const char *what, char *err,
                       size_t errlen)
{
    if (job && atomic_load(&job->aborted)) { /* another rank failed first: its cause */
        pthread_mutex_lock(&job->lock);
        dt_strf(err, errlen, "job aborted: %s", job->abort_msg);
        pthread_mutex_unlock(&job->lock);
    }
    dt_strf(last_error, sizeof last_error, "%s: %s", what, err[0] ? err : dt_strerror(rc));
    if (job && !atomic_load(&job->aborted)) dt_job_report(job, rc, -1, 0, last_error);
    if (job && job->kv) dt_ext_leave(job); /* before the store it polls goes */
    if (c) {
        dt_job_unregister(job, c);
        comm_free(c);
    }
    if (job) {
        dt_job_disconnect(job);
        dt_job_free(job);
    }
    return rc;
}

int dt_comm_world_init(dt_job *job, const char *what, dt_comm **out)
{
    char err[768] = "";
    dt_comm *c = comm_alloc(job, "w", job->rank, job->size);
    int rc = c ? 0 : DT_ERR_NOMEM;
    if (rc == 0) {
        for (int r = 0; r < c->size; r++) c->world_rank[r] = r;
        rc = dt_job_register(job, c);
        if (rc == 0 && !job->kv) rc = dt_mpi_comm_world(c);
        if (rc == 0 && c->size > 1) rc = dt_topo_find_hosts(c);
        if (rc == 0) rc = comm_connect(c);
        if (rc == 0) rc = share_cost_model(c, err, sizeof err);
        if (rc == 0) rc = dt_algo_read_env(c, err, sizeof err);
        if (rc == 0) rc = read_queue_limit(c, err, sizeof err);
        if (rc < 0 && c->err[0]) snprintf(err, sizeof err, "%s", c->err);
    }
    if (rc < 0) return init_failed(job, c, rc, what, err, sizeof err);
    int host_ranks = 0;
    for (int r = 0; r < c->size; r++) host_ranks += c->host_of[r] == c->host_of[c->rank];
    set_waiting(c, host_ranks);
    *out = c;
    return 0;
}

int dt_comm_init(dt_comm **out)
{
    char err[768] = "";
    *out = NULL;
    if (the_job) {
        snprintf(last_error, sizeof last_error,
                 "dt_comm_init: this process already joined the job; destroy that "
                 "communicator first");
        return DT_ERR_INVALID;
    }
    dt_job *job = NULL;
    int rc = dt_job_create(&job, err, sizeof err);
    if (rc == 0 && job->size > 1) rc = dt_job_connect(job, err, sizeof err);
    if (rc < 0) return init_failed(job, NULL, rc, "dt_comm_init", err, sizeof err);
    rc = dt_comm_world_init(job, "dt_comm_init", out);
    if (rc == 0) the_job = job;
    return rc;
}

int dt_comm_init_failed(dt_job *job, int rc, const char *what, const char *err)
{
    char e[768];
    snprintf(e, sizeof e, "%s", err);
    return init_failed(job, NULL, rc, what, e, sizeof e);
}

static int cmp_member(const void *a, const void *b)
{
    const int *x = a, *y = b; /* {key, old rank} */
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

int dt_comm_split(dt_comm *c, int color, int key, dt_comm **out)
{
    if (!c || !out) return DT_ERR_INVALID;
    *out = NULL;
    if (color < 0 && color != DT_UNDEFINED) {
        snprintf(c->err, sizeof c->err,
                 "dt_comm_split: colour %d is negative (use DT_UNDEFINED to opt out)", color);
        return DT_ERR_INVALID;
    }
    int mine[2] = {color, key};
    int *all = malloc((size_t)c->size * 2 * sizeof *all);
    int *members = malloc((size_t)c->size * 2 * sizeof *members);
    if (!all || !members) {
        free(all);
        free(members);
        return DT_ERR_NOMEM;
    }
    int rc = dt_allgather(c, mine, all, 2, DT_I32);
    void *mpi_sub = NULL; /* the matching MPI communicator, when c has one */
    if (rc == 0) rc = dt_mpi_comm_split(c, color, key, &mpi_sub);
    int split_no = c->split_count++;
    int n = 0;
    for (int r = 0; rc == 0 && r < c->size; r++)
        if (all[2 * r] == color && color != DT_UNDEFINED) {
            members[2 * n] = all[2 * r + 1];
            members[2 * n + 1] = r;
            n++;
        }
    free(all);
    if (rc < 0 || color == DT_UNDEFINED) {
        free(members);
        return rc;
    }
    qsort(members, (size_t)n, 2 * sizeof *members, cmp_member);
    char id[96];
    dt_strf(id, sizeof id, "%s.%dc%d", c->id, split_no, color);
    int rank = 0;
    for (int i = 0; i < n; i++)
        if (members[2 * i + 1] == c->rank) rank = i;
    dt_comm *s = comm_alloc(c->job, id, rank, n);
    if (s) s->mpi = mpi_sub;
    if (!s) {
        dt_mpi_comm_release(mpi_sub);
        free(members);
        return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory in split");
    }
    for (int i = 0; i < n; i++) {
        s->world_rank[i] = c->world_rank[members[2 * i + 1]];
        s->host_of[i] = c->host_of[members[2 * i + 1]];
    }
    free(members);
    s->spin_limit = c->spin_limit;
    s->spin_ns = c->spin_ns;
    s->yield_ns = c->yield_ns;
    s->p2p_queue_limit = c->p2p_queue_limit;
    memcpy(s->algo_forced, c->algo_forced, sizeof s->algo_forced);
    rc = dt_job_register(c->job, s);
    if (rc == 0) rc = comm_connect(s);
    if (rc < 0) {
        if (s->err[0]) {
            pthread_mutex_lock(&c->err_lock);
            dt_strf(c->err, sizeof c->err, "dt_comm_split: %s", s->err);
            pthread_mutex_unlock(&c->err_lock);
        }
        dt_job_unregister(c->job, s);
        comm_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void dt_comm_destroy(dt_comm *c)
{
    if (!c) return;
    dt_async_drain(c);
    dt_job *job = c->job;
    int external = job && job->kv;
    int is_world = job && (job == the_job || external) && !strcmp(c->id, "w");
    if (is_world && external) dt_ext_leave(job);
    if (is_world && !external) dt_job_leave(job);
    if (job) dt_job_unregister(job, c);
    comm_free(c);
    if (is_world) {
        int failed = atomic_load(&job->aborted);
        dt_job_disconnect(job);
        dt_job_free(job);
        if (external) return;
        dt_mpi_job_fini(failed);
        the_job = NULL;
    }
}

int dt_comm_rank(const dt_comm *c) { return c ? c->rank : -1; }
int dt_comm_size(const dt_comm *c) { return c ? c->size : -1; }
uint64_t dt_comm_bytes_sent(const dt_comm *c) { return c ? atomic_load(&c->bytes_sent) : 0; }

uint64_t dt_comm_bytes_sent_off_host(const dt_comm *c)
{
    return c ? atomic_load(&c->bytes_off_host) : 0;
}
int dt_comm_local_rank(const dt_comm *c) { return c ? c->local_rank : -1; }
int dt_comm_local_size(const dt_comm *c) { return c ? c->local_size : -1; }
int dt_comm_host_of(const dt_comm *c, int rank)
{
    return c && c->host_of && rank >= 0 && rank < c->size ? c->host_of[rank] : -1;
}
const char *dt_comm_hostname(const dt_comm *c) { return c ? c->job->hostname : "none"; }
const char *dt_comm_transport(const dt_comm *c) { return c ? c->transport_name : "none"; }

const char *dt_comm_error(const dt_comm *c)
{
    if (!c) return "no communicator";
    return c->err[0] ? c->err : "no error";
}

void *dt_comm_scratch(dt_comm *c, size_t bytes)
{
    if (c->dry) return c->dry->scratch;
    if (bytes <= c->scratch_bytes) return c->scratch;
    dt_free(c->scratch);
    c->scratch = dt_alloc(bytes, DT_MEM_COMM);
    c->scratch_bytes = c->scratch ? bytes : 0;
    return c->scratch;
}
