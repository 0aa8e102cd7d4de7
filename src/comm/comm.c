/*
 * Communicator lifecycle: joining the job (store, monitor, transports),
 * splitting into sub-communicators, and tearing down.
 *
 * Each communicator has its own links (shared-memory rings or TCP
 * connections), so collectives on different communicators never share a
 * message stream and can run in any order on different threads. Members on
 * the same host (same hostname and boot id) talk over shared memory unless
 * DTRAIN_TRANSPORT=tcp.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/algorithms.h"
#include "comm/async.h"
#include "comm/bootstrap.h"
#include "comm/comm_internal.h"
#include "comm/mpi.h"
#include "comm/store.h"
#include "core/alloc.h"
#include "core/env.h"
#include "core/log.h"
#include "core/str.h"
#include "core/timer.h"

static char last_error[1024];
static dt_job *the_job; /* one job per process */

const char *dt_last_error(void) { return last_error; }

static uint32_t hash32(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

uint64_t dt_comm_deadline(const dt_comm *c)
{
    return dt_now_ns() + (uint64_t)(c->job->timeout_s * 1e9);
}

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

/* DTRAIN_HOSTNAME stands in for the host's name, so that tests can make
 * ranks of one machine look like several hosts (they then talk TCP). A
 * comma list names each rank's host in rank order ("a,a,b": ranks 0 and 1
 * on a, rank 2 on b), for uneven layouts under one launcher. */
static int fake_hostname(const dt_job *job, char *out, size_t len)
{
    const char *v = dt_env_str("DTRAIN_HOSTNAME");
    if (!v) return 0;
    int n = 1;
    for (const char *s = v; *s; s++) n += *s == ',';
    const char *s = v;
    for (int i = 0; i < job->rank % n; i++) s = strchr(s, ',') + 1;
    size_t k = strcspn(s, ",");
    snprintf(out, len, "%.*s", (int)(k < len ? k : len - 1), s);
    return 1;
}

static void read_host_identity(dt_job *job)
{
    if (fake_hostname(job, job->hostname, sizeof job->hostname))
        ;
    else if (gethostname(job->hostname, sizeof job->hostname) != 0)
        snprintf(job->hostname, sizeof job->hostname, "unknown");
    job->hostname[sizeof job->hostname - 1] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(job->boot_id, sizeof job->boot_id, f)) job->boot_id[0] = '\0';
        fclose(f);
        job->boot_id[strcspn(job->boot_id, "\n")] = '\0';
    }
}

/* The address peers should use to reach us: the one our kernel would use
 * to reach rank 0 (a UDP connect sends nothing). */
static void find_advertise_addr(dt_job *job)
{
    const char *over = dt_env_str("DTRAIN_ADVERTISE_ADDR");
    snprintf(job->advertise_addr, sizeof job->advertise_addr, "%s", over ? over : "127.0.0.1");
    if (over) return;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_DGRAM;
    char port[16];
    snprintf(port, sizeof port, "%d", job->master_port);
    if (getaddrinfo(job->master_addr, port, &hints, &res) != 0 || !res) return;
    int fd = socket(res->ai_family, SOCK_DGRAM, 0);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        const void *a = ss.ss_family == AF_INET6 ? (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                                 : (void *)&((struct sockaddr_in *)&ss)->sin_addr;
        inet_ntop(ss.ss_family, a, job->advertise_addr, sizeof job->advertise_addr);
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
}

static void job_free(dt_job *job)
{
    if (!job) return;
    if (job->wake_fd >= 0) close(job->wake_fd);
    free(job->comms);
    pthread_mutex_destroy(&job->lock);
    pthread_mutex_destroy(&job->store_lock);
    free(job);
}

static int job_create(dt_job **out, char *err, size_t errlen)
{
    dt_bootstrap b;
    if (dt_bootstrap_from_env(&b, err, errlen) < 0) return DT_ERR_INVALID;
    int rc = dt_mpi_job_init(&b, err, errlen); /* under mpirun: MPI up, rank 0's store address */
    if (rc < 0) return rc;
    dt_job *job = calloc(1, sizeof *job);
    if (!job) return DT_ERR_NOMEM;
    pthread_mutex_init(&job->lock, NULL);
    pthread_mutex_init(&job->store_lock, NULL);
    job->rank = b.rank;
    job->size = b.size;
    job->local_rank = b.local_rank;
    job->local_size = b.local_size;
    snprintf(job->launcher, sizeof job->launcher, "%s", b.launcher);
    snprintf(job->master_addr, sizeof job->master_addr, "%s", b.master_addr);
    job->master_port = b.master_port;
    snprintf(job->secret, sizeof job->secret, "%s", b.secret);
    snprintf(job->job_id, sizeof job->job_id, "%s", b.job_id);
    job->timeout_s = b.timeout_s;
    job->force_tcp = b.force_tcp;
    job->use_mpi = b.use_mpi;
    dt_cost_model_defaults(&job->model);
    job->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    read_host_identity(job);
    find_advertise_addr(job);
    dt_log_set_rank(job->rank);
    if (!b.secret_from_env && job->size > 1)
        DT_INFO("no DTRAIN_SECRET in the environment: the store accepts any peer that knows "
                "the job id (launch with `dtrain launch` or export DTRAIN_SECRET)");
    *out = job;
    return 0;
}

/* Rank 0 serves the store; everyone connects to it and opens the control
 * channel that carries heartbeats and aborts. */
static int job_connect(dt_job *job, char *err, size_t errlen)
{
    uint64_t deadline = dt_now_ns() + (uint64_t)(job->timeout_s * 1e9);
    double hb_timeout = job->timeout_s;
    char e[256];
    if (dt_env_double("DTRAIN_HEARTBEAT_TIMEOUT", 0.1, 1e7, &hb_timeout, e, sizeof e) < 0) {
        snprintf(err, errlen, "%s", e);
        return DT_ERR_INVALID;
    }
    double interval = hb_timeout / 4 < 1.0 ? hb_timeout / 4 : 1.0;
    int rc;
    if (job->rank == 0 &&
        (rc = dt_store_server_start(job->master_port, job->size, job->secret, hb_timeout,
                                    &job->server, e, sizeof e)) < 0) {
        snprintf(err, errlen, "rank 0 could not serve the store on port %d: %s",
                 job->master_port, e);
        return rc;
    }
    if ((rc = dt_store_connect(job->master_addr, job->master_port, job->secret, deadline,
                               &job->store, e, sizeof e)) < 0) {
        snprintf(err, errlen, "rank %d could not reach the store at %s:%d: %s", job->rank,
                 job->master_addr, job->master_port, e);
        return rc;
    }
    if ((rc = dt_monitor_start(job->master_addr, job->master_port, job->rank, job->secret,
                               interval, deadline, on_store_abort, job, &job->monitor, e,
                               sizeof e)) < 0) {
        snprintf(err, errlen, "rank %d could not open the control channel: %s", job->rank, e);
        return rc;
    }
    return 0;
}

static void job_disconnect(dt_job *job)
{
    if (job->monitor) dt_monitor_stop(job->monitor);
    if (job->store) dt_store_close(job->store);
    if (job->server)
        dt_store_server_stop(job->server, dt_now_ns() + (uint64_t)(job->timeout_s * 1e9));
    job->monitor = NULL;
    job->store = NULL;
    job->server = NULL;
}

static int job_register(dt_job *job, dt_comm *c)
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

static void job_unregister(dt_job *job, dt_comm *c)
{
    pthread_mutex_lock(&job->lock);
    for (int i = 0; i < job->ncomms; i++)
        if (job->comms[i] == c) job->comms[i] = job->comms[--job->ncomms];
    pthread_mutex_unlock(&job->lock);
}

/* ---- communicator --------------------------------------------------------- */

static int spin_limit(int ranks_on_host)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long spin = ranks_on_host > cpus ? 50 : 4000;
    char e[256];
    if (dt_env_long("DTRAIN_SPIN", 0, 100000000, &spin, e, sizeof e) < 0) DT_WARN("%s", e);
    return (int)spin;
}

static dt_comm *comm_alloc(dt_job *job, const char *id, int rank, int size)
{
    dt_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->job = job;
    snprintf(c->id, sizeof c->id, "%s", id);
    c->tag = hash32(id);
    c->rank = rank;
    c->size = size;
    c->world_rank = calloc((size_t)size, sizeof *c->world_rank);
    c->host_of = calloc((size_t)size, sizeof *c->host_of);
    c->links = calloc((size_t)size, sizeof *c->links);
    c->p2p_send_seq = calloc((size_t)size, sizeof *c->p2p_send_seq);
    c->p2p_recv_seq = calloc((size_t)size, sizeof *c->p2p_recv_seq);
    pthread_mutex_init(&c->err_lock, NULL);
    for (int k = 0; k < DT_COLL_KIND_COUNT; k++) c->algo_forced[k] = DT_ALGO_AUTO;
    c->model_seen = ~0u; /* auto's choices are made on first use */
    c->async = dt_async_create();
    if (!c->world_rank || !c->host_of || !c->links || !c->p2p_send_seq || !c->p2p_recv_seq ||
        !c->async) {
        dt_comm_destroy(c);
        return NULL;
    }
    return c;
}

static void comm_free(dt_comm *c)
{
    if (c->links)
        for (int i = 0; i < c->size; i++)
            if (c->links[i]) c->links[i]->ops->destroy(c->links[i]);
    dt_shm_teardown(c);
    dt_async_destroy(c->async);
    dt_mpi_comm_release(c->mpi);
    dt_free(c->scratch);
    free(c->world_rank);
    free(c->host_of);
    free(c->links);
    free(c->p2p_send_seq);
    free(c->p2p_recv_seq);
    pthread_mutex_destroy(&c->err_lock);
    free(c);
}

/* Links for every peer: shared memory on our host, TCP elsewhere. */
static int comm_connect(dt_comm *c)
{
    int *shm_peers = malloc((size_t)c->size * sizeof *shm_peers);
    int *tcp_peers = malloc((size_t)c->size * sizeof *tcp_peers);
    if (!shm_peers || !tcp_peers) {
        free(shm_peers);
        free(tcp_peers);
        return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory");
    }
    int nshm = 0, ntcp = 0, nlocal = 0;
    for (int r = 0; r < c->size; r++) {
        int same_host = c->host_of[r] == c->host_of[c->rank];
        if (same_host) {
            if (r < c->rank) c->local_rank++;
            nlocal++;
        }
        if (r == c->rank) continue;
        if (same_host && !c->job->force_tcp && !c->job->use_mpi)
            shm_peers[nshm++] = r;
        else
            tcp_peers[ntcp++] = r; /* or MPI's, with DTRAIN_TRANSPORT=mpi */
    }
    c->local_size = nlocal;
    c->nhosts = 0;
    for (int r = 0; r < c->size; r++) {
        int first = 1;
        for (int q = 0; q < r && first; q++) first = c->host_of[q] != c->host_of[r];
        c->nhosts += first;
    }
    c->transport_name = nshm && ntcp ? "shm+tcp" : ntcp ? "tcp" : nshm ? "shm" : "self";
    if (c->job->use_mpi && ntcp) c->transport_name = "mpi";
    int rc = dt_shm_setup(c, shm_peers, nshm);
    if (rc == 0 && c->job->use_mpi) rc = dt_mpi_link_setup(c, tcp_peers, ntcp);
    else if (rc == 0) rc = dt_tcp_setup(c, tcp_peers, ntcp);
    if (rc == 0) rc = dt_comm_store_barrier(c, "connected");
    free(shm_peers);
    free(tcp_peers);
    return rc;
}

/* Exchange "hostname boot-id" through the store and number the hosts. */
static int world_find_hosts(dt_comm *c)
{
    char me[400];
    snprintf(me, sizeof me, "%s %s", c->job->hostname, c->job->boot_id);
    char key[32];
    snprintf(key, sizeof key, "host/%d", c->rank);
    int rc = dt_comm_store_set(c, key, me, strlen(me));
    char **names = calloc((size_t)c->size, sizeof *names);
    if (!names) return DT_ERR_NOMEM;
    for (int r = 0; r < c->size && rc == 0; r++) {
        size_t len;
        snprintf(key, sizeof key, "host/%d", r);
        rc = dt_comm_store_get(c, key, (void **)&names[r], &len);
        if (rc < 0) break;
        c->host_of[r] = r;
        for (int q = 0; q < r; q++)
            if (!strcmp(names[q], names[r])) {
                c->host_of[r] = c->host_of[q];
                break;
            }
    }
    for (int r = 0; r < c->size; r++) free(names[r]);
    free(names);
    return rc;
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
    int rc = job_create(&job, err, sizeof err);
    if (rc == 0 && job->size > 1) rc = job_connect(job, err, sizeof err);
    dt_comm *c = NULL;
    if (rc == 0 && !(c = comm_alloc(job, "w", job->rank, job->size))) rc = DT_ERR_NOMEM;
    if (rc == 0) {
        for (int r = 0; r < c->size; r++) c->world_rank[r] = r;
        rc = job_register(job, c);
        if (rc == 0) rc = dt_mpi_comm_world(c);
        if (rc == 0 && c->size > 1) rc = world_find_hosts(c);
        if (rc == 0) rc = comm_connect(c);
        if (rc == 0) rc = share_cost_model(c, err, sizeof err);
        if (rc == 0) rc = dt_algo_read_env(c, err, sizeof err);
        if (rc < 0 && c->err[0]) snprintf(err, sizeof err, "%s", c->err);
    }
    int host_ranks = 0;
    for (int r = 0; rc == 0 && r < c->size; r++) host_ranks += c->host_of[r] == c->host_of[c->rank];
    if (rc < 0) {
        if (job && atomic_load(&job->aborted)) { /* another rank failed first: its cause */
            pthread_mutex_lock(&job->lock);
            dt_strf(err, sizeof err, "job aborted: %s", job->abort_msg);
            pthread_mutex_unlock(&job->lock);
        }
        dt_strf(last_error, sizeof last_error, "dt_comm_init: %s", err[0] ? err : dt_strerror(rc));
        if (job && job->monitor && !atomic_load(&job->aborted))
            dt_monitor_report(job->monitor, rc, -1, 0, last_error);
        if (c) {
            job_unregister(job, c);
            comm_free(c);
        }
        if (job) {
            job_disconnect(job);
            job_free(job);
        }
        return rc;
    }
    c->spin_limit = spin_limit(host_ranks);
    the_job = job;
    *out = c;
    return 0;
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
    memcpy(s->algo_forced, c->algo_forced, sizeof s->algo_forced);
    rc = job_register(c->job, s);
    if (rc == 0) rc = comm_connect(s);
    if (rc < 0) {
        if (s->err[0]) {
            pthread_mutex_lock(&c->err_lock);
            dt_strf(c->err, sizeof c->err, "dt_comm_split: %s", s->err);
            pthread_mutex_unlock(&c->err_lock);
        }
        job_unregister(c->job, s);
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
    int is_world = job && job == the_job && !strcmp(c->id, "w");
    if (job) job_unregister(job, c);
    comm_free(c);
    if (is_world) {
        int failed = atomic_load(&job->aborted);
        job_disconnect(job);
        job_free(job);
        dt_mpi_job_fini(failed);
        the_job = NULL;
    }
}

int dt_comm_rank(const dt_comm *c) { return c ? c->rank : -1; }
int dt_comm_size(const dt_comm *c) { return c ? c->size : -1; }
uint64_t dt_comm_bytes_sent(const dt_comm *c) { return c ? atomic_load(&c->bytes_sent) : 0; }
int dt_comm_local_rank(const dt_comm *c) { return c ? c->local_rank : -1; }
int dt_comm_local_size(const dt_comm *c) { return c ? c->local_size : -1; }
const char *dt_comm_transport(const dt_comm *c) { return c ? c->transport_name : "none"; }

const char *dt_comm_error(const dt_comm *c)
{
    if (!c) return "no communicator";
    return c->err[0] ? c->err : "no error";
}

void *dt_comm_scratch(dt_comm *c, size_t bytes)
{
    if (c->dry) return dt_dry_scratch(c, bytes);
    if (bytes <= c->scratch_bytes) return c->scratch;
    dt_free(c->scratch);
    c->scratch = dt_alloc(bytes, DT_MEM_COMM);
    c->scratch_bytes = c->scratch ? bytes : 0;
    return c->scratch;
}
