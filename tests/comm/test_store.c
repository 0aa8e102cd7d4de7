/*
 * Unit tests of the store (src/comm/bootstrap/store_*.c), its handshake
 * (auth.c) and sockets (transport/net.c): requests from several threads, blocking and timed-out
 * GETs, refused secrets, hostile connections, and every abort path of the
 * control channel. Returns non-zero and prints each failed check.
 *
 * A few tests speak the wire format directly (a rank that says HELLO and
 * then dies or goes silent, a client that sends a bad length); those
 * helpers mirror the header layout documented in store_wire.h.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h" /* tests/check.h */
#include "comm/bootstrap/auth.h"
#include "comm/bootstrap/store.h"
#include "comm/transport/net.h"
#include "core/log.h"
#include "core/timer.h"
#include "dtrain/comm.h"

#define SECRET "unit-test-secret"

static uint64_t in_s(double s) { return dt_now_ns() + (uint64_t)(s * 1e9); }

static double since_s(uint64_t t0) { return (double)(dt_now_ns() - t0) * 1e-9; }

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The server API takes a port and does not report one it picked, so find a
 * free port first and retry if someone takes it in between. */
static dt_store_server *start_server(int world, double beat_timeout_s, int *port)
{
    for (int attempt = 0; attempt < 20; attempt++) {
        int fd, p;
        char err[256];
        if (dt_net_listen(NULL, 0, &fd, &p, err, sizeof err) != 0) continue;
        close(fd);
        dt_store_server *s;
        if (dt_store_server_start("127.0.0.1", p, world, SECRET, beat_timeout_s, &s, err, sizeof err) == 0) {
            *port = p;
            return s;
        }
    }
    fprintf(stderr, "cannot start a store server\n");
    exit(2);
}

static dt_store *connect_store(int port)
{
    dt_store *st = NULL;
    char err[512];
    int rc = dt_store_connect("127.0.0.1", port, SECRET, in_s(5), &st, err, sizeof err);
    CHECK(rc == 0, "connect: %s", err);
    return st;
}

static int get_string(dt_store *st, const char *key, char *buf, size_t len, double timeout_s)
{
    void *v;
    size_t n;
    int rc = dt_store_get(st, key, &v, &n, in_s(timeout_s));
    if (rc) return rc;
    snprintf(buf, len, "%s", (char *)v);
    free(v);
    return 0;
}

/* ---- raw wire helpers --------------------------------------------------- */

enum { RAW_SET = 1, RAW_HELLO = 16, RAW_HEARTBEAT = 17, RAW_REPLY = 32 };

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void raw_hdr(unsigned char *p, int type, uint32_t id, int32_t a, int32_t b,
                    uint32_t key_len, uint32_t val_len)
{
    p[0] = (unsigned char)type;
    p[1] = 0;
    p[2] = 0x44; /* magic 0x5344, little-endian */
    p[3] = 0x53;
    put32(p + 4, id);
    put32(p + 8, (uint32_t)a);
    put32(p + 12, (uint32_t)b);
    put32(p + 16, key_len);
    put32(p + 20, val_len);
}

/* A connected socket, authenticated when secret is not NULL. */
static int raw_connect(int port, const char *secret)
{
    int fd;
    char err[256];
    if (dt_net_connect("127.0.0.1", port, in_s(5), &fd, err, sizeof err) != 0) {
        CHECK(0, "raw connect: %s", err);
        return -1;
    }
    if (secret && dt_auth_client(fd, secret, "store", in_s(5), err, sizeof err) != 0) {
        CHECK(0, "raw auth: %s", err);
        close(fd);
        return -1;
    }
    return fd;
}

/* Join as a control connection of rank, as a monitor would. */
static int raw_hello(int port, int rank, int interval_ms)
{
    int fd = raw_connect(port, SECRET);
    if (fd < 0) return -1;
    unsigned char h[24], r[24];
    raw_hdr(h, RAW_HELLO, 1, rank, interval_ms, 0, 0);
    int rc = dt_net_write_all(fd, h, sizeof h, in_s(5));
    if (rc == 0) rc = dt_net_read_all(fd, r, sizeof r, in_s(5));
    CHECK(rc == 0 && r[0] == RAW_REPLY && r[8] == 0, "raw HELLO for rank %d not accepted", rank);
    return fd;
}

/* Whether the server closes fd within timeout_s (reading and dropping
 * whatever it sends first). */
static int closed_by_server(int fd, double timeout_s)
{
    uint64_t deadline = in_s(timeout_s);
    for (;;) {
        char buf[256];
        int rc = dt_net_read_all(fd, buf, 1, deadline);
        if (rc == DT_ERR_PEER) return 1;
        if (rc != 0) return 0;
    }
}

/* ---- abort recorder ----------------------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int count;
    int code;
    char msg[1100];
    unsigned left; /* bit r: told that rank r left */
} abort_rec;

static void rec_init(abort_rec *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
}

static void rec_destroy(abort_rec *r)
{
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

static void on_left(void *arg, int rank)
{
    abort_rec *r = arg;
    pthread_mutex_lock(&r->mu);
    if (rank >= 0 && rank < 32) r->left |= 1u << rank;
    pthread_mutex_unlock(&r->mu);
}

static unsigned rec_left(abort_rec *r)
{
    pthread_mutex_lock(&r->mu);
    unsigned left = r->left;
    pthread_mutex_unlock(&r->mu);
    return left;
}

static void on_abort(void *arg, int code, const char *msg);
static const dt_monitor_events events = {on_abort, on_left};

static void on_abort(void *arg, int code, const char *msg)
{
    abort_rec *r = arg;
    pthread_mutex_lock(&r->mu);
    if (r->count++ == 0) {
        r->code = code;
        snprintf(r->msg, sizeof r->msg, "%s", msg);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Wait until r fired (or timeout_s); returns how many times it fired. */
static int rec_wait(abort_rec *r, double timeout_s)
{
    uint64_t deadline = in_s(timeout_s);
    pthread_mutex_lock(&r->mu);
    while (r->count == 0 && dt_now_ns() < deadline) {
        pthread_mutex_unlock(&r->mu);
        sleep_s(0.005);
        pthread_mutex_lock(&r->mu);
    }
    int n = r->count;
    pthread_mutex_unlock(&r->mu);
    return n;
}

static int rec_count(abort_rec *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->count;
    pthread_mutex_unlock(&r->mu);
    return n;
}

static dt_monitor *start_monitor(int port, int rank, abort_rec *r)
{
    dt_monitor *m = NULL;
    char err[512];
    int rc = dt_monitor_start("127.0.0.1", port, rank, SECRET, 0.05, in_s(5), &events, r, &m,
                              err, sizeof err);
    CHECK(rc == 0, "monitor of rank %d: %s", rank, err);
    return m;
}

/* ---- requests ------------------------------------------------------------- */

static void test_basic(void)
{
    int port;
    dt_store_server *srv = start_server(1, 0, &port);
    dt_store *st = connect_store(port);
    char buf[64];
    int64_t v = 0;

    CHECK(dt_store_set(st, "a", "hello", 5) == 0, "%s", dt_store_error(st));
    CHECK(get_string(st, "a", buf, sizeof buf, 1) == 0 && !strcmp(buf, "hello"), "got '%s'", buf);
    CHECK(dt_store_set(st, "a", "bye", 3) == 0, "%s", dt_store_error(st));
    CHECK(get_string(st, "a", buf, sizeof buf, 1) == 0 && !strcmp(buf, "bye"), "got '%s'", buf);
    CHECK(dt_store_set(st, "empty", NULL, 0) == 0, "%s", dt_store_error(st));
    void *val;
    size_t len = 99;
    CHECK(dt_store_get(st, "empty", &val, &len, in_s(1)) == 0 && len == 0 && ((char *)val)[0] == 0,
          "empty value: len %zu", len);
    free(val);

    CHECK(dt_store_add(st, "ctr", 5, &v) == 0 && v == 5, "add: %lld", (long long)v);
    CHECK(dt_store_add(st, "ctr", -2, &v) == 0 && v == 3, "add: %lld", (long long)v);
    CHECK(get_string(st, "ctr", buf, sizeof buf, 1) == 0 && !strcmp(buf, "3"), "counter '%s'", buf);
    CHECK(dt_store_add(st, "a", 1, &v) == DT_ERR_INVALID, "ADD on text accepted");
    CHECK(strstr(dt_store_error(st), "integer"), "message: %s", dt_store_error(st));
    CHECK(dt_store_add(st, "ctr", INT64_MAX, &v) == DT_ERR_INVALID, "overflow accepted");

    char long_key[DT_STORE_MAX_KEY + 2];
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = 0;
    CHECK(dt_store_set(st, long_key, "x", 1) == DT_ERR_INVALID, "over-long key accepted");
    CHECK(dt_store_set(st, "", "x", 1) == DT_ERR_INVALID, "empty key accepted");
    long_key[DT_STORE_MAX_KEY] = 0; /* exactly at the limit */
    CHECK(dt_store_set(st, long_key, "x", 1) == 0, "%s", dt_store_error(st));

    /* A value big enough to need many socket reads and writes. */
    size_t big = 3u << 20;
    char *data = malloc(big);
    for (size_t i = 0; i < big; i++) data[i] = (char)(i * 7);
    CHECK(dt_store_set(st, "big", data, big) == 0, "%s", dt_store_error(st));
    CHECK(dt_store_get(st, "big", &val, &len, in_s(5)) == 0 && len == big &&
              memcmp(val, data, big) == 0,
          "big value came back wrong (%zu bytes)", len);
    free(val);
    free(data);

    dt_store_close(st);
    uint64_t t0 = dt_now_ns();
    dt_store_server_stop(srv, in_s(5));
    CHECK(since_s(t0) < 1.0, "stop without control connections took %.2f s", since_s(t0));
}

#define NTHREADS 6

typedef struct {
    int port;
    int index;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    dt_store *st = connect_store(a->port);
    if (!st) return NULL;
    char key[32], val[32], buf[32];
    snprintf(key, sizeof key, "rank/%d", a->index);
    snprintf(val, sizeof val, "value-%d", a->index);
    CHECK(dt_store_set(st, key, val, strlen(val)) == 0, "%s", dt_store_error(st));
    CHECK(dt_store_barrier(st, "b", NTHREADS, in_s(10)) == 0, "%s", dt_store_error(st));
    /* After the barrier every key is there: no GET may wait. */
    for (int i = 0; i < NTHREADS; i++) {
        snprintf(key, sizeof key, "rank/%d", i);
        snprintf(val, sizeof val, "value-%d", i);
        CHECK(get_string(st, key, buf, sizeof buf, 0.5) == 0 && !strcmp(buf, val),
              "thread %d read %s = '%s'", a->index, key, buf);
    }
    int64_t v;
    CHECK(dt_store_add(st, "sum", a->index + 1, &v) == 0, "%s", dt_store_error(st));
    CHECK(dt_store_barrier(st, "b", NTHREADS, in_s(10)) == 0, "%s", dt_store_error(st));
    CHECK(get_string(st, "sum", buf, sizeof buf, 0.5) == 0 &&
              atoi(buf) == NTHREADS * (NTHREADS + 1) / 2,
          "sum after the second barrier: '%s'", buf);
    CHECK(dt_store_barrier(st, "b", NTHREADS, in_s(10)) == 0, "%s", dt_store_error(st));
    dt_store_close(st);
    return NULL;
}

static void test_threads(void)
{
    int port;
    dt_store_server *srv = start_server(1, 0, &port);
    pthread_t t[NTHREADS];
    worker_arg args[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        args[i] = (worker_arg){port, i};
        pthread_create(&t[i], NULL, worker, &args[i]);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    dt_store_server_stop(srv, in_s(5));
}

typedef struct {
    int port;
    int rc;
    char value[64];
    double waited_s;
} getter_arg;

static void *late_getter(void *p)
{
    getter_arg *a = p;
    dt_store *st = connect_store(a->port);
    if (!st) return NULL;
    uint64_t t0 = dt_now_ns();
    a->rc = get_string(st, "late", a->value, sizeof a->value, 5);
    a->waited_s = since_s(t0);
    dt_store_close(st);
    return NULL;
}

static void test_get_waits(void)
{
    int port;
    dt_store_server *srv = start_server(1, 0, &port);
    getter_arg a = {.port = port, .rc = -100};
    pthread_t t;
    pthread_create(&t, NULL, late_getter, &a);
    sleep_s(0.3);
    dt_store *st = connect_store(port);
    CHECK(dt_store_set(st, "late", "finally", 7) == 0, "%s", dt_store_error(st));
    pthread_join(t, NULL);
    CHECK(a.rc == 0 && !strcmp(a.value, "finally"), "rc %d value '%s'", a.rc, a.value);
    CHECK(a.waited_s > 0.2 && a.waited_s < 3, "GET returned after %.2f s", a.waited_s);

    /* A GET that times out... */
    char buf[64] = "";
    uint64_t t0 = dt_now_ns();
    int rc = get_string(st, "never", buf, sizeof buf, 0.3);
    double took = since_s(t0);
    CHECK(rc == DT_ERR_TIMEOUT, "rc %d", rc);
    CHECK(took > 0.25 && took < 2, "timed out after %.2f s", took);
    CHECK(strstr(dt_store_error(st), "'never'"), "message: %s", dt_store_error(st));
    /* ... leaves the connection usable, even once its key appears. */
    dt_store *other = connect_store(port);
    CHECK(dt_store_set(other, "never", "now", 3) == 0, "%s", dt_store_error(other));
    CHECK(dt_store_set(st, "x", "1", 1) == 0, "%s", dt_store_error(st));
    CHECK(get_string(st, "x", buf, sizeof buf, 1) == 0 && !strcmp(buf, "1"), "got '%s'", buf);
    CHECK(get_string(st, "never", buf, sizeof buf, 1) == 0 && !strcmp(buf, "now"), "got '%s'", buf);

    /* A barrier that not everyone reaches says how many did. */
    rc = dt_store_barrier(st, "lonely", 3, in_s(0.2));
    CHECK(rc == DT_ERR_TIMEOUT && strstr(dt_store_error(st), "1 of 3"), "rc %d: %s", rc,
          dt_store_error(st));
    dt_store_close(other);
    dt_store_close(st);
    dt_store_server_stop(srv, in_s(5));
}

/* ---- refused and hostile connections ---------------------------------------- */

static void test_wrong_secret(void)
{
    int port;
    dt_store_server *srv = start_server(1, 0, &port);
    dt_store *st = NULL;
    char err[512] = "";
    int rc = dt_store_connect("127.0.0.1", port, "not-the-secret", in_s(5), &st, err, sizeof err);
    CHECK(rc == DT_ERR_AUTH && st == NULL, "rc %d", rc);
    CHECK(strstr(err, "refused our job secret"), "message: %s", err);

    dt_monitor *m = NULL;
    abort_rec r;
    rec_init(&r);
    rc = dt_monitor_start("127.0.0.1", port, 0, "wrong", 0.05, in_s(5), &events, &r, &m, err,
                          sizeof err);
    CHECK(rc == DT_ERR_AUTH && m == NULL, "monitor with a wrong secret: rc %d", rc);
    rec_destroy(&r);

    st = connect_store(port);
    CHECK(st && dt_store_set(st, "k", "v", 1) == 0, "server stopped serving after a bad secret");
    dt_store_close(st);
    dt_store_server_stop(srv, in_s(5));
}

static void send_raw(int fd, const void *buf, size_t n)
{
    CHECK(dt_net_write_all(fd, buf, n, in_s(2)) == 0, "raw send failed");
}

static void test_hostile(void)
{
    int port;
    dt_store_server *srv = start_server(1, 0, &port);
    unsigned char h[24];

    /* Not the handshake at all. */
    int fd = raw_connect(port, NULL);
    char junk[68];
    memset(junk, 'x', sizeof junk);
    send_raw(fd, junk, sizeof junk);
    CHECK(closed_by_server(fd, 3), "junk handshake not dropped");
    close(fd);

    /* A client that never speaks must not hold up the others. */
    int silent = raw_connect(port, NULL);
    uint64_t t0 = dt_now_ns();
    dt_store *st = connect_store(port);
    CHECK(st && dt_store_set(st, "k", "v", 1) == 0, "store blocked by a silent client");
    CHECK(since_s(t0) < 1.0, "a silent client delayed others by %.2f s", since_s(t0));

    /* Authenticated, then lengths beyond every limit. */
    uint32_t bad[][2] = {{0xffffffffu, 0}, {DT_STORE_MAX_KEY + 1, 1}, {3, DT_STORE_MAX_VALUE + 1},
                         {0, 5}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fd = raw_connect(port, SECRET);
        raw_hdr(h, RAW_SET, 1, 0, 0, bad[i][0], bad[i][1]);
        send_raw(fd, h, sizeof h);
        CHECK(closed_by_server(fd, 3), "SET with key %u value %u bytes not dropped", bad[i][0],
              bad[i][1]);
        close(fd);
    }
    /* Bad magic, an unknown type, and a control message on a request
     * connection. */
    fd = raw_connect(port, SECRET);
    raw_hdr(h, RAW_SET, 1, 0, 0, 1, 1);
    h[2] = 0;
    send_raw(fd, h, sizeof h);
    CHECK(closed_by_server(fd, 3), "bad magic not dropped");
    close(fd);
    fd = raw_connect(port, SECRET);
    raw_hdr(h, 99, 1, 0, 0, 0, 0);
    send_raw(fd, h, sizeof h);
    CHECK(closed_by_server(fd, 3), "unknown type not dropped");
    close(fd);
    fd = raw_connect(port, SECRET);
    raw_hdr(h, RAW_SET, 1, 0, 0, 1, 1);
    send_raw(fd, h, sizeof h);
    send_raw(fd, "kv", 2);
    raw_hdr(h, RAW_HEARTBEAT, 2, 0, 0, 0, 0);
    send_raw(fd, h, sizeof h);
    CHECK(closed_by_server(fd, 3), "HEARTBEAT on a request connection not dropped");
    close(fd);
    /* Half a message, then gone. */
    fd = raw_connect(port, SECRET);
    raw_hdr(h, RAW_SET, 1, 0, 0, 4, 100);
    send_raw(fd, h, sizeof h);
    send_raw(fd, "ke", 2);
    close(fd);

    char buf[16];
    CHECK(dt_store_set(st, "after", "ok", 2) == 0 && get_string(st, "after", buf, sizeof buf, 1) == 0 &&
              !strcmp(buf, "ok"),
          "server harmed by hostile clients: %s", dt_store_error(st));
    dt_store_close(st);
    close(silent);
    t0 = dt_now_ns();
    dt_store_server_stop(srv, in_s(5));
    CHECK(since_s(t0) < 2.0, "stop took %.2f s", since_s(t0));
}

/* ---- control channel ------------------------------------------------------- */

static void test_monitor_fail(void)
{
    int port;
    dt_store_server *srv = start_server(4, 30, &port);
    abort_rec r[4];
    dt_monitor *m[4];
    for (int i = 0; i < 3; i++) {
        rec_init(&r[i]);
        m[i] = start_monitor(port, i, &r[i]);
    }
    rec_init(&r[3]);

    /* The same rank twice, and a rank outside the world, are refused. */
    dt_monitor *dup = NULL;
    char err[512] = "";
    int rc = dt_monitor_start("127.0.0.1", port, 1, SECRET, 0.05, in_s(5), &events, &r[3], &dup,
                              err, sizeof err);
    CHECK(rc == DT_ERR_INVALID && !dup && strstr(err, "already connected"), "rc %d: %s", rc, err);
    rc = dt_monitor_start("127.0.0.1", port, 9, SECRET, 0.05, in_s(5), &events, &r[3], &dup, err,
                          sizeof err);
    CHECK(rc == DT_ERR_INVALID && !dup, "rank 9 of 4 accepted: rc %d", rc);
    sleep_s(0.1);
    CHECK(rec_count(&r[0]) == 0, "a refused HELLO aborted the job: %s", r[0].msg);

    const char *msg = "rank 1: allreduce #7 sent 10 floats, rank 2 expected 12";
    CHECK(dt_monitor_report(m[1], DT_ERR_MISMATCH, 2, 0, msg) == 0, "report failed");
    for (int i = 0; i < 3; i++) {
        CHECK(rec_wait(&r[i], 5) == 1, "rank %d heard %d aborts", i, rec_count(&r[i]));
        CHECK(r[i].code == DT_ERR_MISMATCH && !strcmp(r[i].msg, msg), "rank %d: code %d '%s'", i,
              r[i].code, r[i].msg);
    }
    /* Later causes change nothing: the first one wins, once. */
    CHECK(dt_monitor_report(m[2], DT_ERR_PEER, 1, 0, "a second failure") == 0, "report failed");
    /* A rank that joins after the abort still hears it. */
    m[3] = start_monitor(port, 3, &r[3]);
    CHECK(rec_wait(&r[3], 5) == 1 && !strcmp(r[3].msg, msg), "late rank heard '%s'", r[3].msg);
    sleep_s(0.1);
    for (int i = 0; i < 4; i++) CHECK(rec_count(&r[i]) == 1, "rank %d heard %d aborts", i, rec_count(&r[i]));

    for (int i = 0; i < 4; i++) dt_monitor_stop(m[i]);
    uint64_t t0 = dt_now_ns();
    dt_store_server_stop(srv, in_s(5));
    CHECK(since_s(t0) < 1.0, "stop after BYEs took %.2f s", since_s(t0));
    for (int i = 0; i < 4; i++) rec_destroy(&r[i]);
}

static void test_rank_lost(void)
{
    int port;
    dt_store_server *srv = start_server(3, 30, &port);
    abort_rec r[2];
    dt_monitor *m[2];
    for (int i = 0; i < 2; i++) {
        rec_init(&r[i]);
        m[i] = start_monitor(port, i, &r[i]);
    }
    int fd = raw_hello(port, 2, 50);
    sleep_s(0.1);
    CHECK(rec_count(&r[0]) == 0, "aborted early: %s", r[0].msg);
    close(fd); /* rank 2 dies: no BYE */
    for (int i = 0; i < 2; i++) {
        CHECK(rec_wait(&r[i], 5) == 1, "rank %d not told", i);
        CHECK(r[i].code == DT_ERR_PEER && strstr(r[i].msg, "rank 2 was lost"), "rank %d: %d '%s'",
              i, r[i].code, r[i].msg);
    }
    for (int i = 0; i < 2; i++) dt_monitor_stop(m[i]);
    dt_store_server_stop(srv, in_s(5));
    for (int i = 0; i < 2; i++) rec_destroy(&r[i]);
}

static void test_heartbeat_timeout(void)
{
    int port;
    dt_store_server *srv = start_server(3, 0.4, &port);
    abort_rec r[2];
    dt_monitor *m[2];
    for (int i = 0; i < 2; i++) {
        rec_init(&r[i]);
        m[i] = start_monitor(port, i, &r[i]);
    }
    uint64_t t0 = dt_now_ns();
    int fd = raw_hello(port, 2, 50); /* then silence, like a stopped process */
    for (int i = 0; i < 2; i++) {
        CHECK(rec_wait(&r[i], 5) == 1, "rank %d not told", i);
        CHECK(r[i].code == DT_ERR_TIMEOUT && strstr(r[i].msg, "rank 2 is unresponsive"),
              "rank %d: %d '%s'", i, r[i].code, r[i].msg);
    }
    CHECK(since_s(t0) > 0.35, "aborted after only %.2f s", since_s(t0));
    for (int i = 0; i < 2; i++) dt_monitor_stop(m[i]);
    close(fd);
    dt_store_server_stop(srv, in_s(5));
    for (int i = 0; i < 2; i++) rec_destroy(&r[i]);
}

/* A rank that times out waiting for rank 1, while rank 2 is the one that
 * stopped: everyone is told about rank 2. */
static void test_timeout_blame(void)
{
    int port;
    dt_store_server *srv = start_server(3, 30, &port);
    abort_rec r[2];
    dt_monitor *m[2];
    for (int i = 0; i < 2; i++) {
        rec_init(&r[i]);
        m[i] = start_monitor(port, i, &r[i]);
    }
    int fd = raw_hello(port, 2, 50);
    sleep_s(0.3);
    const char *msg = "rank 0: timed out in allreduce #3 waiting for rank 1";
    CHECK(dt_monitor_report(m[0], DT_ERR_TIMEOUT, 1, 1, msg) == 0, "report failed");
    for (int i = 0; i < 2; i++) {
        CHECK(rec_wait(&r[i], 5) == 1, "rank %d not told", i);
        CHECK(r[i].code == DT_ERR_TIMEOUT && strstr(r[i].msg, "rank 2 is unresponsive") &&
                  strstr(r[i].msg, msg),
              "rank %d: %d '%s'", i, r[i].code, r[i].msg);
    }
    for (int i = 0; i < 2; i++) dt_monitor_stop(m[i]);
    close(fd);
    dt_store_server_stop(srv, in_s(5));
    for (int i = 0; i < 2; i++) rec_destroy(&r[i]);

    /* With every heartbeat on time, the reporter's own words go out. */
    srv = start_server(2, 30, &port);
    for (int i = 0; i < 2; i++) {
        rec_init(&r[i]);
        m[i] = start_monitor(port, i, &r[i]);
    }
    sleep_s(0.2);
    CHECK(dt_monitor_report(m[1], DT_ERR_TIMEOUT, 0, 1, msg) == 0, "report failed");
    for (int i = 0; i < 2; i++) {
        CHECK(rec_wait(&r[i], 5) == 1, "rank %d not told", i);
        CHECK(r[i].code == DT_ERR_TIMEOUT && !strcmp(r[i].msg, msg), "rank %d: '%s'", i, r[i].msg);
    }
    for (int i = 0; i < 2; i++) dt_monitor_stop(m[i]);
    dt_store_server_stop(srv, in_s(5));
    for (int i = 0; i < 2; i++) rec_destroy(&r[i]);
}

/* Ranks that leave with BYE abort nothing; a server that goes away is
 * reported by every monitor still running. */
static void test_goodbye_and_server_loss(void)
{
    int port;
    dt_store_server *srv = start_server(3, 30, &port);
    abort_rec r[3];
    dt_monitor *m[3];
    for (int i = 0; i < 3; i++) {
        rec_init(&r[i]);
        m[i] = start_monitor(port, i, &r[i]);
    }
    dt_monitor_stop(m[0]);
    dt_monitor_stop(m[1]);
    sleep_s(0.2);
    CHECK(rec_count(&r[2]) == 0, "a clean goodbye aborted the job: %s", r[2].msg);
    /* The ranks still there hear of each goodbye (a rank that left while
     * they wait for it is an error they can name at once). */
    CHECK(rec_left(&r[2]) == 3u, "rank 2 heard of the departures of ranks %#x, not 0 and 1",
          rec_left(&r[2]));

    /* Rank 0 goes away without waiting for rank 2's BYE. */
    dt_store_server_stop(srv, 0);
    CHECK(rec_wait(&r[2], 5) == 1, "rank 2 not told that the store is gone");
    CHECK(r[2].code == DT_ERR_PEER && strstr(r[2].msg, "lost the connection to the store on rank 0"),
          "rank 2: %d '%s'", r[2].code, r[2].msg);
    dt_monitor_stop(m[2]);
    CHECK(rec_count(&r[0]) == 0 && rec_count(&r[1]) == 0, "a stopped monitor fired");
    for (int i = 0; i < 3; i++) rec_destroy(&r[i]);
}

int main(void)
{
    /* Settle the log level before threads race to read it. */
    (void)dt_log_enabled(DT_LOG_ERROR);
    uint64_t t0 = dt_now_ns();
    test_basic();
    test_threads();
    test_get_waits();
    test_wrong_secret();
    test_hostile();
    test_monitor_fail();
    test_rank_lost();
    test_heartbeat_timeout();
    test_timeout_blame();
    test_goodbye_and_server_loss();
    int n = atomic_load(&failures);
    if (n) {
        fprintf(stderr, "test_store: %d check(s) failed\n", n);
        return 1;
    }
    printf("test_store: all passed in %.1f s\n", since_s(t0));
    return 0;
}
