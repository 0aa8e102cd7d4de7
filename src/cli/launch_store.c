/*
 * The store of a job that restarts (--max-restarts), on the launchers'
 * side. Node 0's launcher serves it in its own process, so that it
 * outlives every rank (the ranks are told so: DTRAIN_STORE_SERVER), and
 * serves a fresh one for each attempt, on the attempt's secret, so that
 * nothing of an earlier attempt (a key, the store's verdict on a rank, a
 * rank left over) reaches the next. Every node's launcher connects to it,
 * meets the others there before its ranks start, and learns there how the
 * attempt ended: the first node to report a failure decides whether all
 * restart or all end, and every node done is success. A thread of ours
 * waits for that verdict and says when it is in through a pipe that the
 * watch's poll() follows.
 *
 * The keys of an attempt's store: launch/config (node 0's -n and
 * --max-restarts, which every node must share), launch/start and
 * launch/go (the meeting), launch/done (nodes whose ranks all exited 0),
 * launch/ended (whoever adds to it first writes launch/verdict),
 * launch/seen and launch/seen_all (the other nodes have read the verdict,
 * so node 0 may stop the store).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/launch.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/store.h"
#include "comm/transport/net.h"
#include "core/env.h"
#include "core/timer.h"
#include "dtrain/comm.h"

#define MS_NS 1000000ull
#define SLICE_NS (100 * MS_NS)       /* a wait looks at signals and the verdict this often */
#define DIAL_SLICE_NS (1000 * MS_NS) /* the same, while node 0's store is not up yet */
/* How long node 0 keeps an attempt's store for the other nodes to read
 * its verdict (they do at once, unless their launcher is gone), and how
 * long the server then waits for the ranks' goodbyes. */
#define SEEN_WAIT_NS (10000 * MS_NS)
#define STOP_WAIT_NS (1000 * MS_NS)

/* What a wait for a key ended with, besides 0 (the key is there) and the
 * store's DT_ERR_* codes. */
enum { WAIT_VERDICT = 1, WAIT_STOPPED = 2 };
/* How an attempt's start went (launch_store_open's answers). */
enum { START_GO = 0, START_VERDICT = 1, START_FAILED = -1 };

struct launch_store {
    double timeout_s, beat_timeout_s;
    char addr[300]; /* node 0's store, for messages */

    /* One attempt's. */
    dt_store_server *server; /* node 0 */
    dt_store *req;           /* the main thread's requests */
    dt_store *watch;         /* the watcher's wait for the verdict */
    pthread_t thread;
    int thread_started;
    int stop_fd;             /* eventfd: ends the watcher's wait */
    int pipe_r, pipe_w;      /* the watcher writes a byte once it has ended */
    int watch_rc;            /* the watcher's wait: 0, or a DT_ERR_* code */
    char value[256];         /* the verdict as stored */
    char watch_err[768];
    int reported_done, reported_fail, won;
    int verdict_read;
    int seen; /* this node told node 0 it is done with the store */
    int lost;       /* a request failed: the store is gone */
    int lost_rc;    /* that request's DT_ERR_* code */
    char why[768];  /* and its error */
};

/* ---- the watcher ---------------------------------------------------------- */

static void *watch_main(void *arg)
{
    struct launch_store *s = arg;
    void *val = NULL;
    size_t len = 0;
    s->watch_rc = dt_store_get(s->watch, "launch/verdict", &val, &len, 0);
    if (s->watch_rc == 0)
        snprintf(s->value, sizeof s->value, "%s", (const char *)val);
    else
        snprintf(s->watch_err, sizeof s->watch_err, "%s", dt_store_error(s->watch));
    free(val);
    ssize_t w = write(s->pipe_w, "v", 1);
    (void)w; /* an empty pipe of ours cannot be full */
    return NULL;
}

static void wake_watcher(struct launch_store *s)
{
    uint64_t one = 1;
    ssize_t w = write(s->stop_fd, &one, sizeof one);
    (void)w;
}

static void join_watcher(struct launch_store *s)
{
    if (!s->thread_started) return;
    wake_watcher(s);
    pthread_join(s->thread, NULL);
    s->thread_started = 0;
}

static int start_watcher(struct job *j)
{
    struct launch_store *s = j->store;
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0) return -1;
    s->pipe_r = p[0];
    s->pipe_w = p[1];
    s->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->stop_fd < 0) return -1;
    dt_store_set_abort_fd(s->watch, s->stop_fd);
    int rc = pthread_create(&s->thread, NULL, watch_main, s);
    if (rc) {
        errno = rc;
        return -1;
    }
    s->thread_started = 1;
    return 0;
}

static int verdict_ready(const struct launch_store *s)
{
    struct pollfd p = {.fd = s->pipe_r, .events = POLLIN};
    return s->thread_started && poll(&p, 1, 0) > 0;
}

/* A request failed: the store is gone (or out of step, which is as bad).
 * The watcher is told to end, so that the watch learns it as the verdict. */
static void lose(struct job *j, int rc)
{
    struct launch_store *s = j->store;
    if (!s->lost) {
        snprintf(s->why, sizeof s->why, "%s", dt_store_error(s->req));
        s->lost_rc = rc;
    }
    s->lost = 1;
    wake_watcher(s);
}

/* ---- requests --------------------------------------------------------------- */

/* Waits for key (into val when given), in slices, so that a stop signal,
 * or the verdict before the ranks have started, ends the wait. 0, a
 * WAIT_* or the store's DT_ERR_* code. */
static int wait_key(struct job *j, const char *key, uint64_t deadline, char *val, size_t n)
{
    struct launch_store *s = j->store;
    const int signals = j->signalled;
    for (;;) {
        uint64_t now = dt_now_ns();
        if (now >= deadline) return DT_ERR_TIMEOUT;
        void *v;
        size_t len;
        int rc = dt_store_get(s->req, key, &v, &len, deadline - now > SLICE_NS ? now + SLICE_NS
                                                                             : deadline);
        if (rc == 0 && val) snprintf(val, n, "%s", (const char *)v);
        if (rc == 0) free(v);
        if (rc != DT_ERR_TIMEOUT) return rc;
        launch_read_signals(j);
        if (j->signalled != signals) return WAIT_STOPPED;
        if (verdict_ready(s)) return WAIT_VERDICT;
    }
}

/* The first node to add to launch/ended writes the verdict. */
static void decide(struct job *j, const char *value)
{
    struct launch_store *s = j->store;
    int64_t n;
    int rc = dt_store_add(s->req, "launch/ended", 1, &n);
    if (rc == 0 && n == 1) rc = dt_store_set(s->req, "launch/verdict", value, strlen(value));
    if (rc != 0)
        lose(j, rc);
    else if (n == 1)
        s->won = 1;
}

static int usable(const struct job *j)
{
    const struct launch_store *s = j->store;
    return s && s->req && s->thread_started && !s->lost && !s->verdict_read;
}

void launch_store_report(struct job *j, int rank, int status, const char *what, int restart)
{
    if (!usable(j) || j->store->reported_fail) return;
    j->store->reported_fail = 1;
    char value[sizeof j->store->value];
    snprintf(value, sizeof value, "fail %ld %d %d %d %s", j->o->node_rank, rank, status,
             restart, what);
    decide(j, value);
}

void launch_store_done(struct job *j)
{
    if (!usable(j) || j->store->reported_done) return;
    j->store->reported_done = 1;
    int64_t n;
    int rc = dt_store_add(j->store->req, "launch/done", 1, &n);
    if (rc != 0)
        lose(j, rc);
    else if (n == j->o->nnodes)
        decide(j, "done");
}

/* ---- an attempt's start ---------------------------------------------------------- */

static int failed(struct job *j, int status)
{
    launch_record_failure(j, status);
    return START_FAILED;
}

/* A wait's end, as an attempt's start: a failed request leaves the store
 * lost, which the verdict then says. */
static int start_result(struct job *j, int rc)
{
    if (rc == 0) return START_GO;
    if (rc == WAIT_STOPPED) return START_FAILED; /* the signal's handling said so */
    if (rc != WAIT_VERDICT) lose(j, rc);
    return START_VERDICT;
}

static int serve(struct job *j)
{
    struct launch_store *s = j->store;
    char err[512];
    int world = (int)(j->o->nnodes * j->active);
    if (dt_store_server_start(j->id.master_addr, j->id.master_port, world, j->attempt_secret,
                              s->beat_timeout_s, &s->server, err, sizeof err) == 0)
        return 0;
    fprintf(stderr, PROG ": cannot serve the job's store on port %d (attempt %d): %s\n",
            j->id.master_port, j->restarts, err);
    return failed(j, 1);
}

static int dial_failed(struct job *j, int rc, const char *err)
{
    const struct launch_store *s = j->store;
    if (rc == DT_ERR_AUTH)
        fprintf(stderr, PROG ": node 0's store at %s refused this launcher's secret: every node "
                "must export the same DTRAIN_SECRET (%s)\n", s->addr, err);
    else
        fprintf(stderr, PROG ": cannot reach node 0's store at %s for attempt %d within %g s "
                "(DTRAIN_TIMEOUT): is node 0's launcher running? (%s)\n", s->addr, j->restarts,
                s->timeout_s, err);
    return failed(j, 1);
}

/* Connects to node 0's store, retrying until the deadline: node 0's
 * launcher may start later than ours, and between attempts its server
 * comes back only once every node has read the last verdict. */
static int dial(struct job *j, dt_store **out, uint64_t deadline)
{
    char err[512];
    const int signals = j->signalled;
    dt_store_set_server_name("node 0's launcher");
    for (;;) {
        uint64_t now = dt_now_ns();
        uint64_t until = deadline - now > DIAL_SLICE_NS ? now + DIAL_SLICE_NS : deadline;
        int rc = dt_store_connect(j->id.master_addr, j->id.master_port, j->attempt_secret, until,
                                  out, err, sizeof err);
        if (rc == 0) return 0;
        /* The last attempt's store, on the last attempt's secret, may not
         * have gone yet; a refusal of the first attempt's is a wrong one. */
        int again = rc == DT_ERR_TIMEOUT || rc == DT_ERR_PEER ||
                    (rc == DT_ERR_AUTH && j->restarts > 0);
        if (!again || dt_now_ns() >= deadline) return dial_failed(j, rc, err);
        launch_read_signals(j);
        if (j->signalled != signals) return START_FAILED;
        if (rc != DT_ERR_TIMEOUT) nanosleep(&(struct timespec){.tv_nsec = 50 * MS_NS}, NULL);
    }
}

/* Every node must start the same ranks and restart as often, or they
 * would part ways at the first restart. */
static int agree_config(struct job *j, uint64_t deadline)
{
    struct launch_store *s = j->store;
    char mine[64], theirs[64];
    snprintf(mine, sizeof mine, "-n %ld --max-restarts %ld", j->o->nproc, j->o->max_restarts);
    if (j->o->node_rank == 0)
        return start_result(j, dt_store_set(s->req, "launch/config", mine, strlen(mine)));
    int rc = wait_key(j, "launch/config", deadline, theirs, sizeof theirs);
    if (rc != 0) return start_result(j, rc);
    if (strcmp(mine, theirs) == 0) return START_GO;
    char what[96];
    snprintf(what, sizeof what, "its launcher has %.32s, node 0's %.32s", mine, theirs);
    fprintf(stderr, PROG ": this node's launcher has %s, but node 0's has %s: every node needs "
            "the same\n", mine, theirs);
    launch_store_report(j, -1, CLI_EXIT_USAGE, what, 0);
    return failed(j, CLI_EXIT_USAGE);
}

/* Every node's launcher arrives before any starts its ranks. */
static int meet(struct job *j, uint64_t deadline)
{
    struct launch_store *s = j->store;
    int64_t n;
    int rc = dt_store_add(s->req, "launch/start", 1, &n);
    if (rc == 0 && n == j->o->nnodes) rc = dt_store_set(s->req, "launch/go", "1", 1);
    if (rc == 0) rc = wait_key(j, "launch/go", deadline, NULL, 0);
    if (rc != DT_ERR_TIMEOUT) return start_result(j, rc);
    if (dt_store_add(s->req, "launch/start", 0, &n) != 0) n = -1;
    fprintf(stderr, PROG ": %" PRId64 " of the %ld nodes came to node 0's store at %s within "
            "%g s (DTRAIN_TIMEOUT) for attempt %d; giving up\n", n, j->o->nnodes, s->addr,
            s->timeout_s, j->restarts);
    return failed(j, 1);
}

int launch_store_open(struct job *j)
{
    struct launch_store *s = j->store;
    if (!s) return 0;
    s->watch_rc = s->reported_done = s->reported_fail = s->won = 0;
    s->verdict_read = s->lost = s->seen = 0;
    s->value[0] = s->why[0] = '\0';
    uint64_t deadline = dt_now_ns() + (uint64_t)(s->timeout_s * 1e9);
    if (j->o->node_rank == 0 && serve(j) < 0) return START_FAILED;
    if (dial(j, &s->req, deadline) < 0 || dial(j, &s->watch, deadline) < 0) return START_FAILED;
    if (start_watcher(j) < 0) {
        fprintf(stderr, PROG ": cannot wait for the attempt's verdict: %s\n", strerror(errno));
        return failed(j, 1);
    }
    int rc = agree_config(j, deadline);
    return rc == START_GO ? meet(j, deadline) : rc;
}

/* ---- the verdict --------------------------------------------------------------- */

int launch_store_fd(const struct job *j)
{
    return j->store && j->store->thread_started ? j->store->pipe_r : -1;
}

int launch_store_waiting(const struct job *j)
{
    return j->store && j->store->thread_started && !j->store->verdict_read;
}

static void lost_verdict(const struct job *j, struct verdict *v)
{
    const struct launch_store *s = j->store;
    const char *err = s->lost ? s->why : s->watch_err;
    v->lost = 1;
    if (j->o->node_rank == 0)
        snprintf(v->why, sizeof v->why, "lost this launcher's own store at %s: %.600s", s->addr,
                 err);
    else if ((s->lost ? s->lost_rc : s->watch_rc) == DT_ERR_PEER)
        snprintf(v->why, sizeof v->why, "lost the connection to node 0's store at %s: node 0's "
                 "launcher is gone (killed, or its host is down)", s->addr);
    else
        snprintf(v->why, sizeof v->why, "lost node 0's store at %s (%.600s): node 0's launcher is "
                 "gone or cannot be reached", s->addr, err);
}

static int parse_verdict(const char *value, struct verdict *v)
{
    if (strcmp(value, "done") == 0) {
        v->done = 1;
        return 0;
    }
    int off = -1;
    if (sscanf(value, "fail %ld %d %d %d %n", &v->node, &v->rank, &v->status, &v->restart,
               &off) < 4 || off < 0)
        return -1;
    snprintf(v->what, sizeof v->what, "%s", value + off);
    return 0;
}

/* Node 0 keeps the store until every other node is done with it: has
 * read the verdict, or goes without it. */
static void tell_seen(struct job *j)
{
    struct launch_store *s = j->store;
    int64_t n;
    if (j->o->node_rank == 0 || s->seen || !s->req || s->lost) return;
    s->seen = 1;
    if (dt_store_add(s->req, "launch/seen", 1, &n) == 0 && n == j->o->nnodes - 1)
        dt_store_set(s->req, "launch/seen_all", "1", 1);
}

void launch_store_verdict(struct job *j, struct verdict *v)
{
    struct launch_store *s = j->store;
    memset(v, 0, sizeof *v);
    char c;
    ssize_t r = read(s->pipe_r, &c, 1);
    (void)r;
    join_watcher(s); /* it has ended; joining makes its results ours */
    s->verdict_read = 1;
    if (!s->lost && s->watch_rc == 0 && parse_verdict(s->value, v) < 0) {
        snprintf(s->why, sizeof s->why, "a verdict it cannot read: '%s'", s->value);
        s->lost = 1;
        s->lost_rc = DT_ERR_PROTOCOL;
    }
    if (s->lost || s->watch_rc != 0) {
        lost_verdict(j, v);
        return;
    }
    v->ours = s->won;
    tell_seen(j);
}

/* ---- an attempt's end ------------------------------------------------------------ */

void launch_store_close(struct job *j)
{
    struct launch_store *s = j->store;
    if (!s) return;
    tell_seen(j);
    if (s->req && s->verdict_read && !s->lost) {
        /* Node 0 waits for the others to read the verdict; another node
         * that restarts waits for node 0 to stop the store (its
         * connection ends), so that it never knocks at the last attempt's
         * store with the next attempt's secret. */
        if (j->o->node_rank == 0 && j->o->nnodes > 1)
            wait_key(j, "launch/seen_all", dt_now_ns() + SEEN_WAIT_NS, NULL, 0);
        else if (j->o->node_rank > 0 && j->restart_pending)
            wait_key(j, "launch/closed", dt_now_ns() + SEEN_WAIT_NS + 2 * STOP_WAIT_NS, NULL, 0);
    }
    join_watcher(s);
    if (s->req) dt_store_close(s->req);
    if (s->watch) dt_store_close(s->watch);
    s->req = s->watch = NULL;
    if (s->pipe_r >= 0) close(s->pipe_r);
    if (s->pipe_w >= 0) close(s->pipe_w);
    if (s->stop_fd >= 0) close(s->stop_fd);
    s->pipe_r = s->pipe_w = s->stop_fd = -1;
    if (s->server) dt_store_server_stop(s->server, dt_now_ns() + STOP_WAIT_NS);
    s->server = NULL;
}

/* The ranks' timeouts (comm/bootstrap/env.c, comm/job.c), which the
 * server's heartbeat deadline and our waits follow too. */
static int read_timeouts(struct launch_store *s)
{
    char err[256];
    s->timeout_s = DT_DEFAULT_TIMEOUT_S;
    if (dt_env_double("DTRAIN_TIMEOUT", 0.1, 1e7, &s->timeout_s, err, sizeof err) >= 0) {
        s->beat_timeout_s = s->timeout_s;
        if (dt_env_double("DTRAIN_HEARTBEAT_TIMEOUT", 0.1, 1e7, &s->beat_timeout_s, err,
                          sizeof err) >= 0)
            return 0;
    }
    fprintf(stderr, PROG ": %s\n", err);
    return -1;
}

int launch_store_init(struct job *j)
{
    if (j->o->max_restarts == 0) return 0;
    struct launch_store *s = calloc(1, sizeof *s);
    if (!s) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    if (read_timeouts(s) < 0) {
        free(s);
        return CLI_EXIT_USAGE;
    }
    s->pipe_r = s->pipe_w = s->stop_fd = -1;
    dt_net_host_port(s->addr, sizeof s->addr, j->id.master_addr, j->id.master_port);
    j->store = s;
    return 0;
}

void launch_store_free(struct job *j)
{
    launch_store_close(j);
    free(j->store);
    j->store = NULL;
}
