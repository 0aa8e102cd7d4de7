/*
 * Joining a job that Open MPI's mpirun started, and the MPI communicators
 * that shadow dtrain's.
 *
 * Under mpirun (and with MPI built in) the job initialises MPI with
 * MPI_THREAD_MULTIPLE, because communicators are driven from different
 * threads and each has its own progress thread, unless the program did so
 * already; it then finalizes it at the world communicator's destroy only
 * if it initialised it. Rank 0 picks the store's address and port (and a
 * random secret, unless DTRAIN_SECRET is set) and broadcasts them over
 * MPI, so a job spread over hosts needs no MASTER_ADDR.
 *
 * Each dtrain communicator gets its own MPI communicator (c->mpi), with the
 * same ranks: MPI's collectives run on it (mpi_coll.c), and so do the MPI
 * links of DTRAIN_TRANSPORT=mpi (mpi_link.c), whose messages therefore
 * never meet another communicator's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi.h"
#include "core/env.h"

int dt_mpi_launched(void)
{
    return dt_env_str("OMPI_COMM_WORLD_RANK") &&
           (dt_env_str("PMIX_RANK") || dt_env_str("OMPI_MCA_orte_hnp_uri"));
}

#ifndef DTRAIN_HAVE_MPI

int dt_mpi_job_init(dt_bootstrap *b, char *err, size_t len)
{
    if (!b->use_mpi) return 0;
    snprintf(err, len,
             "DTRAIN_TRANSPORT=mpi: this dtrain was built without MPI (install libopenmpi-dev "
             "and configure with -DDTRAIN_WITH_MPI=ON)");
    return DT_ERR_INVALID;
}

void dt_mpi_job_fini(int job_failed) { (void)job_failed; }
int dt_mpi_comm_world(dt_comm *c)
{
    (void)c;
    return 0;
}
int dt_mpi_comm_split(dt_comm *c, int color, int key, void **out)
{
    (void)c, (void)color, (void)key;
    *out = NULL;
    return 0;
}
void dt_mpi_comm_release(void *mpi) { (void)mpi; }

#else /* DTRAIN_HAVE_MPI */

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/bootstrap/identity.h"
#include "comm/transport/net.h"
#include "core/log.h"
#include "core/str.h"
#include "core/timer.h"

static int we_initialised; /* MPI_Init_thread was ours: ours to finalize */
static int mpi_usable;     /* initialised with MPI_THREAD_MULTIPLE: communicators may use it */

static const char *thread_level_name(int level)
{
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    }
    return "unknown";
}

static void mpi_error_text(int mpi_rc, char *buf, size_t len)
{
    char text[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(mpi_rc, text, &n) != MPI_SUCCESS) n = 0;
    text[n < MPI_MAX_ERROR_STRING ? n : MPI_MAX_ERROR_STRING - 1] = '\0';
    snprintf(buf, len, "%s", n ? text : "unknown MPI error");
}

int dt_mpi_fail(dt_comm *c, int mpi_rc, int peer, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    mpi_error_text(mpi_rc, text, sizeof text);
    int cls = MPI_ERR_OTHER;
    MPI_Error_class(mpi_rc, &cls);
    return dt_comm_fail(c, cls == MPI_ERR_TRUNCATE ? DT_ERR_MISMATCH : DT_ERR_SYSTEM, peer,
                        "%s: %s", what, text);
}

/* Wait for a request without a communicator to fail (job setup): poll with
 * the job's deadline. 0, or a message in err. */
static int wait_setup(MPI_Request *req, double timeout_s, const char *what, char *err,
                      size_t len)
{
    uint64_t start = dt_now_ns(), limit = (uint64_t)(timeout_s * 1e9);
    for (;;) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            mpi_error_text(rc, text, sizeof text);
            dt_strf(err, len, "%s: %s", what, text);
            return DT_ERR_SYSTEM;
        }
        if (done) return 0;
        uint64_t idle = dt_now_ns() - start;
        if (idle >= limit) {
            dt_strf(err, len, "%s: timed out after %.1f s (DTRAIN_TIMEOUT; did every rank call "
                    "dt_comm_init?)", what, timeout_s);
            return DT_ERR_TIMEOUT;
        }
        dt_poll_nap(idle);
    }
}

/* ---- rank 0's store address ------------------------------------------------ */

/* The address of the interface that carries the default route, else the
 * first non-loopback IPv4 interface. */
static int primary_address(char *out, size_t len)
{
    /* TEST-NET: any routed address will do, nothing is sent. */
    if (dt_net_route_addr("192.0.2.1", 53, out, len) == 0 && strncmp(out, "127.", 4) &&
        strcmp(out, "::1"))
        return 0;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return -1;
    int ok = 0;
    for (struct ifaddrs *i = ifs; i && !ok; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
        ok = inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out,
                       (socklen_t)len) != NULL;
    }
    freeifaddrs(ifs);
    return ok ? 0 : -1;
}

typedef struct {
    char master_addr[256];
    int32_t master_port;
    int32_t secret_random; /* 1: rank 0 drew it, as good as DTRAIN_SECRET */
    char secret[256];
    char job_id[64];
} rank0_says;

/* Rank 0: where the store will be. MASTER_ADDR / MASTER_PORT when set;
 * otherwise the loopback for a one-host job, else DTRAIN_ADVERTISE_ADDR or
 * the primary interface's address, and a port held until the store
 * serves there. */
static void rank0_choose(dt_bootstrap *b, rank0_says *s)
{
    const char *addr = dt_env_str("MASTER_ADDR"), *adv = dt_env_str("DTRAIN_ADVERTISE_ADDR");
    if (addr)
        snprintf(s->master_addr, sizeof s->master_addr, "%s", addr);
    else if (b->local_size == b->size)
        snprintf(s->master_addr, sizeof s->master_addr, "127.0.0.1");
    else if (adv)
        snprintf(s->master_addr, sizeof s->master_addr, "%s", adv);
    else if (primary_address(s->master_addr, sizeof s->master_addr) != 0) {
        DT_WARN("could not find an address of this host for the other ranks to reach the "
                "store; using the loopback (set MASTER_ADDR or DTRAIN_ADVERTISE_ADDR)");
        snprintf(s->master_addr, sizeof s->master_addr, "127.0.0.1");
    }
    s->master_port = b->master_port;
    int fd, port;
    char why[256];
    if (!dt_env_str("MASTER_PORT")) {
        if (dt_net_reserve_port(s->master_addr, 0, &fd, &port, why, sizeof why) == 0) {
            s->master_port = port;
            b->port_hold = fd;
        } else {
            DT_DEBUG("no port held for the store (%s); it takes port %d", why, s->master_port);
        }
    }
    snprintf(s->secret, sizeof s->secret, "%s", b->secret);
    if (!b->secret_from_env && dt_ident_random_secret(s->secret, sizeof s->secret) == 0)
        s->secret_random = 1;
    if (dt_env_str("DTRAIN_JOB_ID"))
        snprintf(s->job_id, sizeof s->job_id, "%s", b->job_id);
    else
        dt_ident_job_id(s->secret, s->master_addr, s->master_port, s->job_id, sizeof s->job_id);
}

static int share_rank0_choice(dt_bootstrap *b, char *err, size_t len)
{
    rank0_says s;
    memset(&s, 0, sizeof s);
    if (b->rank == 0) rank0_choose(b, &s);
    MPI_Request req;
    int rc = MPI_Ibcast(&s, (int)sizeof s, MPI_BYTE, 0, MPI_COMM_WORLD, &req);
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        mpi_error_text(rc, text, sizeof text);
        dt_strf(err, len, "MPI_Ibcast of rank 0's store address: %s", text);
        return DT_ERR_SYSTEM;
    }
    rc = wait_setup(&req, b->timeout_s, "broadcast of rank 0's store address over MPI", err, len);
    if (rc) return rc;
    s.master_addr[sizeof s.master_addr - 1] = s.secret[sizeof s.secret - 1] = '\0';
    s.job_id[sizeof s.job_id - 1] = '\0';
    snprintf(b->master_addr, sizeof b->master_addr, "%s", s.master_addr);
    b->master_port = s.master_port;
    snprintf(b->secret, sizeof b->secret, "%s", s.secret);
    snprintf(b->job_id, sizeof b->job_id, "%s", s.job_id);
    if (s.secret_random) b->secret_from_env = 1;
    DT_DEBUG("store at %s:%d, as rank 0 said over MPI", b->master_addr, b->master_port);
    return 0;
}

/* ---- the job ---------------------------------------------------------------- */

/* DTRAIN_TRANSPORT=mpi where it cannot work: an error (none when not asked). */
static int refuse_transport(const dt_bootstrap *b, const char *why, char *err, size_t len)
{
    if (!b->use_mpi) return 0;
    dt_strf(err, len, "DTRAIN_TRANSPORT=mpi%s", why);
    return DT_ERR_INVALID;
}

int dt_mpi_job_init(dt_bootstrap *b, char *err, size_t len)
{
    mpi_usable = 0;
    if (strcmp(b->launcher, "openmpi") || !dt_mpi_launched()) {
        const char *by = b->launcher;
        if (!strcmp(b->launcher, "none")) by = "no launcher";
        if (!strcmp(b->launcher, "torchrun")) by = "torchrun or `dtrain launch`";
        if (!strcmp(b->launcher, "openmpi")) by = "hand (Open MPI's variables, but no mpirun)";
        char why[160];
        dt_strf(why, sizeof why, " needs ranks started by Open MPI's mpirun (this job was "
                "started by %s)", by);
        return refuse_transport(b, why, err, len);
    }
    int finalized = 0, initialized = 0, provided = MPI_THREAD_SINGLE, rc;
    MPI_Finalized(&finalized);
    if (finalized && !b->master_addr[0]) {
        /* The first world communicator's destroy finalized MPI: no rank 0
         * to ask any more (the loopback serves a one-host job). */
        dt_strf(err, len, "MPI was finalized already in this process (at the first world "
                "communicator's destroy): a second dt_comm_init needs MASTER_ADDR");
        return DT_ERR_INVALID;
    }
    if (finalized)
        return refuse_transport(b, ": MPI was finalized already in this process", err, len);
    MPI_Initialized(&initialized);
    if (!initialized) {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            mpi_error_text(rc, text, sizeof text);
            dt_strf(err, len, "MPI_Init_thread: %s", text);
            return DT_ERR_SYSTEM;
        }
        we_initialised = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    int mrank = -1, msize = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &mrank);
    MPI_Comm_size(MPI_COMM_WORLD, &msize);
    if (mrank != b->rank || msize != b->size) {
        dt_strf(err, len, "MPI_COMM_WORLD says rank %d of %d, but OMPI_COMM_WORLD_RANK/SIZE say "
                "%d of %d", mrank, msize, b->rank, b->size);
        return DT_ERR_INVALID;
    }
    if (provided < MPI_THREAD_MULTIPLE) {
        char why[160];
        dt_strf(why, sizeof why, ": MPI gives %s, and dtrain drives MPI from several threads, "
                "so it needs MPI_THREAD_MULTIPLE", thread_level_name(provided));
        if (b->use_mpi) return refuse_transport(b, why, err, len);
        DT_WARN("%s: the MPI algorithms are off (bootstrap still uses MPI)", why + 2);
    }
    if ((rc = share_rank0_choice(b, err, len)) < 0) return rc;
    if (provided >= MPI_THREAD_MULTIPLE) {
        if (dt_mpi_ops_create() != 0) {
            dt_strf(err, len, "MPI_Op_create of the bf16/f16 reductions failed");
            return DT_ERR_SYSTEM;
        }
        mpi_usable = 1;
    }
    return 0;
}

void dt_mpi_job_fini(int job_failed)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (mpi_usable) dt_mpi_ops_free();
    mpi_usable = 0;
    if (!we_initialised) return;
    if (job_failed) {
        /* MPI_Finalize waits for every rank, and a failed job may have lost
         * some: leave the rest to mpirun. */
        DT_DEBUG("the job failed: not finalizing MPI");
        return;
    }
    MPI_Finalize();
    we_initialised = 0;
}

/* ---- communicators ---------------------------------------------------------- */

static int adopt(dt_comm *c, MPI_Comm m, void **out)
{
    MPI_Comm *h = malloc(sizeof *h);
    if (!h) {
        MPI_Comm_free(&m);
        return dt_comm_fail(c, DT_ERR_NOMEM, -1, "out of memory");
    }
    /* Errors come back as codes, to fail the communicator with MPI's text. */
    MPI_Comm_set_errhandler(m, MPI_ERRORS_RETURN);
    *h = m;
    *out = h;
    return 0;
}

int dt_mpi_comm_world(dt_comm *c)
{
    if (!mpi_usable) return 0;
    MPI_Comm m = MPI_COMM_NULL;
    MPI_Request req;
    char err[512];
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &m, &req);
    if (rc != MPI_SUCCESS) return dt_mpi_fail(c, rc, -1, "MPI_Comm_idup(MPI_COMM_WORLD)");
    rc = wait_setup(&req, c->job->timeout_s, "MPI_Comm_idup(MPI_COMM_WORLD)", err, sizeof err);
    if (rc) return dt_comm_fail(c, rc, -1, "%s", err);
    return adopt(c, m, &c->mpi);
}

int dt_mpi_comm_split(dt_comm *c, int color, int key, void **out)
{
    *out = NULL;
    if (!c->mpi) return 0;
    MPI_Comm m = MPI_COMM_NULL;
    int rc = MPI_Comm_split(dt_mpi_comm(c), color == DT_UNDEFINED ? MPI_UNDEFINED : color, key,
                            &m);
    if (rc != MPI_SUCCESS) return dt_mpi_fail(c, rc, -1, "MPI_Comm_split");
    if (m == MPI_COMM_NULL) return 0;
    return adopt(c, m, out);
}

void dt_mpi_comm_release(void *mpi)
{
    if (!mpi) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free((MPI_Comm *)mpi);
    free(mpi);
}

#endif /* DTRAIN_HAVE_MPI */
