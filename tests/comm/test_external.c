/*
 * dt_comm_init_external: communicators joined through the caller's store.
 * The ranks are threads of this one process (a process may hold several
 * such communicators), over an in-memory store of the test's own that
 * counts its calls. Checked against serial references:
 *
 *  - 3 ranks join, all-reduce, all-gather and an all-reduce in flight
 *    together with a split's all-reduce, and leave; then 2 groups of the
 *    same 3 threads at once, on two stores, interleaved;
 *  - a rank whose all-reduce count differs: every rank fails within a few
 *    seconds (far below the timeout), each message naming the count;
 *  - a rank whose store fails while the links are set up: every rank
 *    fails within seconds, with its message;
 *  - a rank that never joins: the others fail at the timeout, naming it;
 *  - bad arguments, and a store that already served a communicator.
 *
 * Run once on shared memory and once with DTRAIN_TRANSPORT=tcp.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "dtrain/comm.h"

/* ---- an in-memory store ------------------------------------------------- */

typedef struct kv_entry {
    char *key;
    void *val;
    size_t len;
    struct kv_entry *next;
} kv_entry;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kv_entry *head;
    _Atomic long calls;
} kv_store;

static void kv_init(kv_store *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
}

static void kv_free(kv_store *s)
{
    for (kv_entry *e = s->head, *n; e; e = n) {
        n = e->next;
        free(e->key);
        free(e->val);
        free(e);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

static kv_entry *kv_find(kv_store *s, const char *key)
{
    for (kv_entry *e = s->head; e; e = e->next)
        if (!strcmp(e->key, key)) return e;
    return NULL;
}

/* Called with s->mu held. */
static void kv_put(kv_store *s, const char *key, const void *val, size_t len)
{
    kv_entry *e = kv_find(s, key);
    if (!e) {
        e = calloc(1, sizeof *e);
        e->key = strdup(key);
        e->next = s->head;
        s->head = e;
    }
    free(e->val);
    e->val = malloc(len ? len : 1);
    memcpy(e->val, val, len);
    e->len = len;
    pthread_cond_broadcast(&s->cv);
}

static int kv_set(void *ctx, const char *key, const void *val, size_t len, char *err,
                  size_t errlen)
{
    kv_store *s = ctx;
    (void)err, (void)errlen;
    s->calls++;
    pthread_mutex_lock(&s->mu);
    kv_put(s, key, val, len);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int kv_get(void *ctx, const char *key, double timeout_s, void **val, size_t *len,
                  char *err, size_t errlen)
{
    kv_store *s = ctx;
    s->calls++;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long long ns = until.tv_nsec + (long long)(timeout_s * 1e9);
    until.tv_sec += ns / 1000000000LL;
    until.tv_nsec = ns % 1000000000LL;
    pthread_mutex_lock(&s->mu);
    kv_entry *e;
    int rc = 0;
    while (!(e = kv_find(s, key)) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&s->cv, &s->mu, &until);
    if (e) {
        /* Past the value, bytes that differ from call to call: dtrain must
         * not read a value as a C string beyond its length. */
        char *v = malloc(e->len + 16);
        memcpy(v, e->val, e->len);
        memset(v + e->len, 'a' + (int)(s->calls % 26), 15);
        v[e->len + 15] = '\0';
        *val = v;
        *len = e->len;
    }
    pthread_mutex_unlock(&s->mu);
    if (!e) snprintf(err, errlen, "no key %s", key);
    return e ? 0 : DT_ERR_TIMEOUT;
}

static int kv_add(void *ctx, const char *key, int64_t delta, int64_t *result, char *err,
                  size_t errlen)
{
    kv_store *s = ctx;
    (void)err, (void)errlen;
    s->calls++;
    pthread_mutex_lock(&s->mu);
    kv_entry *e = kv_find(s, key);
    int64_t v = 0;
    if (e) memcpy(&v, e->val, sizeof v);
    v += delta;
    kv_put(s, key, &v, sizeof v);
    pthread_mutex_unlock(&s->mu);
    *result = v;
    return 0;
}

static const dt_kv_ops kv_ops = {kv_set, kv_get, kv_add};

/* The same store, whose writes fail once the links are being set up. */
static int injected(const char *key, char *err, size_t errlen)
{
    if (strncmp(key, "w/shm", 5) && strncmp(key, "w/tcp", 5)) return 0;
    snprintf(err, errlen, "injected failure writing %s", key);
    return DT_ERR_SYSTEM;
}

static int faulty_set(void *ctx, const char *key, const void *val, size_t len, char *err,
                      size_t errlen)
{
    int rc = injected(key, err, errlen);
    return rc ? rc : kv_set(ctx, key, val, len, err, errlen);
}

static int faulty_add(void *ctx, const char *key, int64_t delta, int64_t *result, char *err,
                      size_t errlen)
{
    int rc = injected(key, err, errlen);
    return rc ? rc : kv_add(ctx, key, delta, result, err, errlen);
}

static const dt_kv_ops faulty_ops = {faulty_set, kv_get, faulty_add};

/* ---- ranks as threads ---------------------------------------------------- */

#define NRANKS 3

typedef struct {
    int rank;
    kv_store *store, *store2;
    int mode;
    int rc;            /* of the call under test */
    char err[1024];    /* its message */
    double seconds;    /* how long it took */
} rank_arg;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static float input(int rank, size_t i) { return (float)((int)(i % 97) - 40 + 3 * rank); }

static void check_allreduce(dt_comm *c, int rank, size_t n, const char *what)
{
    float *x = calloc(n ? n : 1, sizeof *x); /* zeroed: gcc -O2 saw it read before written */
    for (size_t i = 0; i < n; i++) x[i] = input(rank, i);
    int rc = dt_allreduce(c, x, x, n, DT_F32, DT_SUM);
    CHECK(rc == 0, "%s: rank %d: allreduce: %s", what, rank, dt_comm_error(c));
    for (size_t i = 0; rc == 0 && i < n; i++) {
        float want = 0;
        for (int r = 0; r < dt_comm_size(c); r++) want += input(r, i);
        if (x[i] != want) {
            CHECK(0, "%s: rank %d: element %zu is %g, want %g", what, rank, i, x[i], want);
            break;
        }
    }
    free(x);
}

static void run_basic(rank_arg *a)
{
    dt_comm *c = NULL;
    int rc = dt_comm_init_external(&kv_ops, a->store, a->rank, NRANKS, 30, &c);
    CHECK(rc == 0, "rank %d: init: %s", a->rank, dt_last_error());
    if (rc) return;
    CHECK(dt_comm_rank(c) == a->rank && dt_comm_size(c) == NRANKS, "rank/size %d/%d",
          dt_comm_rank(c), dt_comm_size(c));
    const char *tr = getenv("DTRAIN_TRANSPORT");
    const char *want_tr = tr && !strcmp(tr, "tcp") ? "tcp" : "shm";
    CHECK(!strcmp(dt_comm_transport(c), want_tr), "transport %s, want %s", dt_comm_transport(c),
          want_tr);
    check_allreduce(c, a->rank, 1001, "basic");
    int mine = 10 + a->rank, all[NRANKS] = {0};
    rc = dt_allgather(c, &mine, all, 1, DT_I32);
    for (int r = 0; r < NRANKS; r++)
        CHECK(rc == 0 && all[r] == 10 + r, "allgather[%d] = %d", r, all[r]);
    /* A non-blocking all-reduce in flight while the split is made and used. */
    size_t n = 70000;
    double *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = (double)a->rank + (double)i;
    dt_request *req = NULL;
    rc = dt_iallreduce(c, y, y, n, DT_F64, DT_MAX, &req);
    CHECK(rc == 0, "iallreduce: %s", dt_comm_error(c));
    rc = dt_wait(req);
    CHECK(rc == 0 && y[5] == NRANKS - 1 + 5.0, "iallreduce max: %g", y[5]);
    dt_comm *s = NULL;
    rc = dt_comm_split(c, a->rank % 2, 0, &s);
    CHECK(rc == 0 && s, "split: %s", dt_comm_error(c));
    if (s) {
        int v = a->rank, sum = 0;
        CHECK(dt_allreduce(s, &v, &sum, 1, DT_I32, DT_SUM) == 0, "split allreduce: %s",
              dt_comm_error(s));
        CHECK(sum == (a->rank % 2 ? 1 : 2), "split sum %d", sum);
        dt_comm_destroy(s);
    }
    free(y);
    CHECK(dt_barrier(c) == 0, "barrier: %s", dt_comm_error(c));
    dt_comm_destroy(c);
}

/* Two communicators of the same three threads, each its own job. */
static void run_two(rank_arg *a)
{
    dt_comm *c1 = NULL, *c2 = NULL;
    int rc1 = dt_comm_init_external(&kv_ops, a->store, a->rank, NRANKS, 30, &c1);
    CHECK(rc1 == 0, "rank %d: first init: %s", a->rank, dt_last_error());
    int rc2 = dt_comm_init_external(&kv_ops, a->store2, a->rank, NRANKS, 30, &c2);
    CHECK(rc2 == 0, "rank %d: second init: %s", a->rank, dt_last_error());
    for (int i = 0; rc1 == 0 && rc2 == 0 && i < 3; i++) {
        check_allreduce(c1, a->rank, 513 + i, "first group");
        check_allreduce(c2, a->rank, 77 + i, "second group");
    }
    dt_comm_destroy(c2);
    dt_comm_destroy(c1);
}

/* Rank 2 all-reduces 12 elements, the others 10. */
static void run_mismatch(rank_arg *a)
{
    dt_comm *c = NULL;
    int rc = dt_comm_init_external(&kv_ops, a->store, a->rank, NRANKS, 60, &c);
    CHECK(rc == 0, "rank %d: init: %s", a->rank, dt_last_error());
    if (rc) return;
    float x[12] = {0};
    double t0 = now_s();
    a->rc = dt_allreduce(c, x, x, a->rank == 2 ? 12 : 10, DT_F32, DT_SUM);
    a->seconds = now_s() - t0;
    snprintf(a->err, sizeof a->err, "%s", dt_comm_error(c));
    dt_comm_destroy(c);
}

/* Rank 2's store fails as the links are set up: the others, waiting in
 * the store or for rank 2's connection, hear of it through the store. */
static void run_setup_fails(rank_arg *a)
{
    dt_comm *c = NULL;
    double t0 = now_s();
    a->rc = dt_comm_init_external(a->rank == 2 ? &faulty_ops : &kv_ops, a->store, a->rank,
                                  NRANKS, 60, &c);
    a->seconds = now_s() - t0;
    snprintf(a->err, sizeof a->err, "%s", dt_last_error());
    dt_comm_destroy(c);
}

/* Rank 2 never calls: the others' wait ends at the 1.5 s timeout. */
static void run_absent(rank_arg *a)
{
    if (a->rank == 2) return;
    dt_comm *c = NULL;
    double t0 = now_s();
    a->rc = dt_comm_init_external(&kv_ops, a->store, a->rank, NRANKS, 1.5, &c);
    a->seconds = now_s() - t0;
    snprintf(a->err, sizeof a->err, "%s", dt_last_error());
    dt_comm_destroy(c);
}

static void *rank_main(void *p)
{
    rank_arg *a = p;
    if (a->mode == 0) run_basic(a);
    if (a->mode == 1) run_two(a);
    if (a->mode == 2) run_mismatch(a);
    if (a->mode == 3) run_absent(a);
    if (a->mode == 4) run_setup_fails(a);
    return NULL;
}

static void run_ranks(int mode, rank_arg *args, kv_store *store, kv_store *store2)
{
    pthread_t t[NRANKS];
    for (int r = 0; r < NRANKS; r++) {
        args[r] = (rank_arg){.rank = r, .store = store, .store2 = store2, .mode = mode};
        pthread_create(&t[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < NRANKS; r++) pthread_join(t[r], NULL);
}

/* ---- cases ---------------------------------------------------------------- */

static void test_groups(void)
{
    kv_store s1, s2;
    rank_arg args[NRANKS];
    kv_init(&s1);
    run_ranks(0, args, &s1, NULL);
    CHECK(s1.calls > 0, "the store was never called");
    kv_free(&s1);
    kv_init(&s1);
    kv_init(&s2);
    run_ranks(1, args, &s1, &s2);
    kv_free(&s1);
    kv_free(&s2);
}

static void test_mismatch(void)
{
    kv_store s;
    rank_arg args[NRANKS];
    kv_init(&s);
    run_ranks(2, args, &s, NULL);
    for (int r = 0; r < NRANKS; r++) {
        CHECK_ERR(args[r].rc, args[r].err, "count");
        /* The timeout is 60 s; the failure must travel in well under it. */
        CHECK(args[r].seconds < 10, "rank %d took %.1f s to fail", r, args[r].seconds);
    }
    kv_free(&s);
}

static void test_setup_fails(void)
{
    kv_store s;
    rank_arg args[NRANKS];
    kv_init(&s);
    run_ranks(4, args, &s, NULL);
    for (int r = 0; r < NRANKS; r++) {
        CHECK_ERR(args[r].rc, args[r].err, "dt_comm_init_external", "injected failure");
        CHECK(args[r].seconds < 10, "rank %d took %.1f s to fail", r, args[r].seconds);
    }
    kv_free(&s);
}

static void test_absent(void)
{
    kv_store s;
    rank_arg args[NRANKS];
    kv_init(&s);
    run_ranks(3, args, &s, NULL);
    /* The first to time out tells the other, which may then fail first. */
    for (int r = 0; r < 2; r++) {
        CHECK(args[r].rc == DT_ERR_TIMEOUT || args[r].rc == DT_ERR_ABORTED, "rank %d: rc %d",
              r, args[r].rc);
        CHECK_ERR(args[r].rc, args[r].err, "dt_comm_init_external", "rank 2 never joined");
        CHECK(args[r].seconds < 10, "rank %d took %.1f s", r, args[r].seconds);
    }
    kv_free(&s);
}

static void test_bad_args(void)
{
    kv_store s;
    kv_init(&s);
    dt_comm *c = (dt_comm *)&s;
    CHECK_ERR(dt_comm_init_external(&kv_ops, &s, 3, 3, 10, &c), dt_last_error(), "rank 3");
    CHECK(c == NULL, "*out not cleared");
    CHECK_ERR(dt_comm_init_external(&kv_ops, &s, 0, 0, 10, &c), dt_last_error(), "size 0");
    dt_kv_ops none = {kv_set, NULL, kv_add};
    CHECK_ERR(dt_comm_init_external(&none, &s, 0, 2, 10, &c), dt_last_error(), "get");
    /* A store that already served a communicator of two. */
    int64_t v = 2;
    kv_set(&s, "dtrain/joined", &v, sizeof v, NULL, 0);
    CHECK_ERR(dt_comm_init_external(&kv_ops, &s, 0, 2, 10, &c), dt_last_error(),
              "already served", "fresh store");
    kv_free(&s);
    /* One rank alone needs no store traffic beyond what it reads back. */
    kv_init(&s);
    CHECK(dt_comm_init_external(&kv_ops, &s, 0, 1, 10, &c) == 0, "size 1: %s", dt_last_error());
    check_allreduce(c, 0, 5, "alone");
    dt_comm_destroy(c);
    kv_free(&s);
}

int main(void)
{
    test_bad_args();
    test_groups();
    test_mismatch();
    test_setup_fails();
    test_absent();
    return finish("test_external");
}
