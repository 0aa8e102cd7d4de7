/*
 * Tags select messages (dt_isend_tag, dt_irecv_tag, dt_irecv_any), as in
 * MPI: a receive takes the earliest message from its source (or from any)
 * with its tag, even when messages with other tags were sent before it,
 * and a pair's messages of one tag keep their order. Run by every rank of
 * a job (`dtrain launch -n N`), every payload checked against what its
 * sender drew.
 *
 * Usage: test_p2p_tags [MODE]
 *   (none)   3 ranks or more: two messages received in the opposite order,
 *            posted together and one at a time, from empty to past a
 *            shared-memory ring; six of two tags, each tag's in order;
 *            receives from any source with tags; a large message received
 *            after a later one, whose sender changes its buffer once the
 *            send completed (with cross-memory attach forced, that send
 *            must last until the receive pulls it).
 *   never    2 ranks: rank 1's receive tagged 8 meets rank 0's barrier
 *            behind messages tagged 7 and 9: both ranks fail at once, the
 *            receiver listing what it passed over.
 *   left     2 ranks: rank 1 sends a message tagged 7 and leaves; rank 0's
 *            receive tagged 8 fails naming it and the message.
 *   timeout  2 ranks, DTRAIN_TIMEOUT=2: rank 1's receive tagged 8, with
 *            only a message tagged 7 sent, times out, listing it.
 *   size     2 ranks: rank 1 takes rank 0's message tagged 2, then the
 *            one tagged 1 that came before it (2000 elements: pulled by
 *            cross-memory attach where forced) with a count of 3: both
 *            ranks fail naming the two counts.
 *   limit    2 ranks, DTRAIN_P2P_QUEUE_MB=1: rank 1 receives tag 2 behind
 *            2 MB of messages tagged 1, which the queue may not hold: both
 *            ranks fail, naming the limit.
 *
 * Exit 0 when every check passed; otherwise the failures are printed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h" /* tests/check.h */
#include "core/timer.h"
#include "draw.h"  /* tests/comm/draw.h */
#include "dtrain/comm.h"
#include "must.h" /* tests/comm/must.h */

#define MAX_RANKS 64

static int rank, size;

static int cma_forced(void)
{
    const char *v = getenv("DTRAIN_SHM_CMA");
    return v && !strcmp(v, "1");
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Element e of message `msg` of rank src in case `what`. */
static int32_t value(int what, int src, int msg, size_t e)
{
    return (int32_t)(draw(what, src, msg, e) & 0x7fffffff);
}

static int32_t *drawn(int what, int src, int msg, size_t n)
{
    int32_t *b = malloc((n + 1) * sizeof *b);
    for (size_t e = 0; e < n; e++) b[e] = value(what, src, msg, e);
    return b;
}

/* buf against message `msg` of rank src. */
static void expect(const char *name, int what, int src, int msg, const int32_t *buf, size_t n)
{
    size_t wrong = 0, first = 0;
    for (size_t e = 0; e < n; e++)
        if (buf[e] != value(what, src, msg, e) && !wrong++) first = e;
    CHECK(!wrong, "%s: %zu of %zu elements differ from rank %d's message %d, the first at %zu",
          name, wrong, n, src, msg, first);
}

static int isend(dt_comm *c, const int32_t *b, size_t n, int to, int tag, dt_request **r)
{
    return dt_isend_tag(c, b, n, DT_I32, to, tag, r);
}

static int irecv(dt_comm *c, int32_t *b, size_t n, int from, int tag, dt_request **r)
{
    return dt_irecv_tag(c, b, n, DT_I32, from, tag, r);
}

/* A blocking send or receive with a tag. */
static int send_tag(dt_comm *c, const int32_t *b, size_t n, int to, int tag)
{
    dt_request *r;
    int rc = isend(c, b, n, to, tag, &r);
    return rc ? rc : dt_wait(r);
}

static int recv_tag(dt_comm *c, int32_t *b, size_t n, int from, int tag)
{
    dt_request *r;
    int rc = irecv(c, b, n, from, tag, &r);
    return rc ? rc : dt_wait(r);
}

/* ---- the orders that tags choose ----------------------------------------- */

/* Rank 0 sends a (tag 1) then b (tag 2); rank 1 receives tag 2 first. The
 * receives posted together; then each call waited for before the next
 * (blocking), where the first send must complete before the second
 * starts, so only sizes the link takes without its receive (no pull). */
static void test_reorder(dt_comm *c, int what, size_t n, int blocking)
{
    char name[96];
    snprintf(name, sizeof name, "%s reorder of %zu elements", blocking ? "blocking" : "posted", n);
    if (rank == 0) {
        int32_t *a = drawn(what, 0, 0, n), *b = drawn(what, 0, 1, n);
        if (blocking) {
            must(c, send_tag(c, a, n, 1, 1), "send tag 1");
            must(c, send_tag(c, b, n, 1, 2), "send tag 2");
        } else {
            dt_request *r[2];
            must(c, isend(c, a, n, 1, 1, &r[0]), "dt_isend_tag 1");
            must(c, isend(c, b, n, 1, 2, &r[1]), "dt_isend_tag 2");
            must(c, dt_wait(r[0]), "dt_wait");
            must(c, dt_wait(r[1]), "dt_wait");
        }
        free(a);
        free(b);
    } else if (rank == 1) {
        int32_t *x = calloc(n + 1, sizeof *x), *y = calloc(n + 1, sizeof *y);
        if (blocking) {
            must(c, recv_tag(c, y, n, 0, 2), "recv tag 2");
            must(c, recv_tag(c, x, n, 0, 1), "recv tag 1");
        } else {
            dt_request *r[2];
            must(c, irecv(c, y, n, 0, 2, &r[0]), "dt_irecv_tag 2");
            must(c, irecv(c, x, n, 0, 1, &r[1]), "dt_irecv_tag 1");
            must(c, dt_wait(r[0]), "dt_wait");
            must(c, dt_wait(r[1]), "dt_wait");
        }
        expect(name, what, 0, 1, y, n); /* tag 2 gets b */
        expect(name, what, 0, 0, x, n); /* tag 1 gets a */
        free(x);
        free(y);
    }
}

/* Rank 0 sends six messages, tags 1, 2, 1, 2, 1, 2; rank 1 takes the
 * three tagged 2 first, then those tagged 1: each tag's in the order sent.
 * Posted together, then one at a time. */
static void test_same_tag_order(dt_comm *c, int what, size_t n, int one_by_one)
{
    enum { M = 6 };
    if (rank == 0) {
        int32_t *m[M];
        dt_request *r[M];
        for (int k = 0; k < M; k++) {
            m[k] = drawn(what, 0, k, n);
            must(c, isend(c, m[k], n, 1, 1 + k % 2, &r[k]), "dt_isend_tag");
        }
        for (int k = 0; k < M; k++) {
            must(c, dt_wait(r[k]), "dt_wait");
            free(m[k]);
        }
    } else if (rank == 1) {
        int32_t *got[M];
        dt_request *r[M];
        for (int j = 0; j < M; j++) {
            got[j] = calloc(n + 1, sizeof *got[j]);
            int tag = j < M / 2 ? 2 : 1;
            if (one_by_one)
                must(c, recv_tag(c, got[j], n, 0, tag), "recv");
            else
                must(c, irecv(c, got[j], n, 0, tag, &r[j]), "dt_irecv_tag");
        }
        for (int j = 0; j < M; j++) {
            if (!one_by_one) must(c, dt_wait(r[j]), "dt_wait");
            /* receive j takes message 1, 3, 5 (tag 2), then 0, 2, 4 (tag 1) */
            int sent = j < M / 2 ? 2 * j + 1 : 2 * (j - M / 2);
            char name[96];
            snprintf(name, sizeof name, "same-tag order (%s, %zu elements), receive %d",
                     one_by_one ? "one by one" : "posted together", n, j);
            expect(name, what, 0, sent, got[j], n);
            free(got[j]);
        }
    }
}

/* Ranks 1 and 2 each send rank 0 three messages tagged 5, 6, 5. Rank 0
 * takes the two tagged 6 from any source first, then the four tagged 5:
 * each names its sender and holds that sender's next message of the tag. */
static void test_any_source(dt_comm *c, int what, size_t n)
{
    static const int tags[3] = {5, 6, 5};
    if (rank == 1 || rank == 2) {
        int32_t *m[3];
        dt_request *r[3];
        for (int k = 0; k < 3; k++) {
            m[k] = drawn(what, rank, k, n);
            must(c, isend(c, m[k], n, 0, tags[k], &r[k]), "dt_isend_tag");
        }
        for (int k = 0; k < 3; k++) {
            must(c, dt_wait(r[k]), "dt_wait");
            free(m[k]);
        }
        return;
    }
    if (rank != 0) return;
    int32_t *buf = calloc(n + 1, sizeof *buf);
    int seen5[3] = {0, 0, 0}, seen6[3] = {0, 0, 0};
    for (int j = 0; j < 6; j++) {
        int tag = j < 2 ? 6 : 5, src = -2;
        must(c, dt_recv_any(c, buf, n, DT_I32, tag, &src), "dt_recv_any");
        CHECK(src == 1 || src == 2, "any source, tag %d: sender %d", tag, src);
        if (src != 1 && src != 2) continue;
        /* The sender's message: its one tagged 6 is its second, its
         * first tagged 5 its first, the next its third. */
        int k = tag == 6 ? 1 : seen5[src] ? 2 : 0;
        (tag == 6 ? seen6 : seen5)[src]++;
        char name[96];
        snprintf(name, sizeof name, "any source tag %d, %zu elements, from rank %d", tag, n, src);
        expect(name, what, src, k, buf, n);
    }
    CHECK(seen6[1] == 1 && seen6[2] == 1 && seen5[1] == 2 && seen5[2] == 2,
          "any source with tags: tag 6 from ranks 1, 2: %d, %d; tag 5: %d, %d", seen6[1],
          seen6[2], seen5[1], seen5[2]);
    free(buf);
}

/* Rank 0 sends a large message tagged 1, then a small one tagged 2, and
 * overwrites the large one's buffer once both sends completed. Rank 1
 * takes the small one, waits, then the large one, which must hold what
 * was sent. Pulled by cross-memory attach, the large one stays with its
 * sender until then: the sends last past rank 1's wait. */
#define LATE_WAIT_MS 300
static void test_late_large(dt_comm *c, int what, size_t n)
{
    if (rank == 0) {
        int32_t *big = drawn(what, 0, 0, n), *small = drawn(what, 0, 1, 16);
        dt_request *r[2];
        double t0 = dt_now_s();
        must(c, isend(c, big, n, 1, 1, &r[0]), "dt_isend_tag big");
        must(c, isend(c, small, 16, 1, 2, &r[1]), "dt_isend_tag small");
        must(c, dt_wait(r[0]), "dt_wait");
        must(c, dt_wait(r[1]), "dt_wait");
        double took = dt_now_s() - t0;
        memset(big, 0x5a, n * sizeof *big); /* a second read would see this */
        if (cma_forced())
            CHECK(took >= LATE_WAIT_MS * 0.9e-3, "a pulled message's send completed after %.3f s, "
                  "before its receive came (%d ms)", took, LATE_WAIT_MS);
        free(big);
        free(small);
    } else if (rank == 1) {
        int32_t *x = calloc(n + 1, sizeof *x), y[16];
        must(c, recv_tag(c, y, 16, 0, 2), "recv tag 2");
        expect("the small message behind a large one", what, 0, 1, y, 16);
        sleep_ms(LATE_WAIT_MS);
        must(c, recv_tag(c, x, n, 0, 1), "recv tag 1");
        expect("a large message received after a later one", what, 0, 0, x, n);
        free(x);
    }
}

static void run_orders(dt_comm *c, dt_comm *sync)
{
    /* Empty, small, past a 256 KiB ring and past a 2 MiB one (the pulled
     * sizes with cross-memory attach forced from 4 KiB). */
    static const size_t sizes[] = {0, 1, 1000, 90000, 1000000};
    int what = 1;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        test_reorder(c, what++, n, 0);
        if (!cma_forced() || n * sizeof(int32_t) < 4096) test_reorder(c, what++, n, 1);
        test_same_tag_order(c, what++, n, 0);
        if (!cma_forced() || n * sizeof(int32_t) < 4096) test_same_tag_order(c, what++, n, 1);
        test_any_source(c, what++, n);
        must(sync, dt_barrier(sync), "dt_barrier");
    }
    test_late_large(c, what++, 1000000);
    must(sync, dt_barrier(sync), "dt_barrier");
}

/* ---- receives that can never match --------------------------------------- */

/* The call that must fail, and its message, held to the texts. */
#define MUST_FAIL(c, rc, code, ...)                                                          \
    do {                                                                                     \
        CHECK((rc) == (code), "%s: returned %d (%s), expected %s", dt_comm_error(c), (rc),   \
              dt_strerror(rc), dt_strerror(code));                                           \
        CHECK_ERR(rc, dt_comm_error(c), __VA_ARGS__);                                        \
        printf("rank %d: %s\n", rank, dt_comm_error(c));                                    \
    } while (0)

static void mode_never(dt_comm *c)
{
    int32_t a[4] = {1, 2, 3, 4}, b[100] = {0}, y[4];
    if (rank == 0) {
        must(c, send_tag(c, a, 4, 1, 7), "send tag 7");
        must(c, send_tag(c, b, 100, 1, 9), "send tag 9");
        int rc = dt_barrier(c);
        CHECK(rc != 0, "the barrier after the sends succeeded");
        CHECK_ERR(rc, dt_comm_error(c), "tagged 8");
        printf("rank %d: %s\n", rank, dt_comm_error(c));
    } else if (rank == 1) {
        int rc = recv_tag(c, y, 4, 0, 8);
        MUST_FAIL(c, rc, DT_ERR_MISMATCH, "rank 0 called barrier", "tagged 8",
                  "messages from rank 0 passed over: tagged 7 (16 bytes), tagged 9 (400 bytes)");
    }
}

static void mode_left(dt_comm *c)
{
    int32_t a[4] = {1, 2, 3, 4}, y[4];
    if (rank == 1) {
        must(c, send_tag(c, a, 4, 0, 7), "send tag 7");
    } else if (rank == 0) {
        int rc = recv_tag(c, y, 4, 1, 8);
        MUST_FAIL(c, rc, DT_ERR_PEER, "rank 1 left", "messages from rank 1 passed over: "
                  "tagged 7 (16 bytes)");
    }
}

static void mode_timeout(dt_comm *c)
{
    int32_t a[4] = {1, 2, 3, 4}, y[4];
    if (rank == 0) {
        must(c, send_tag(c, a, 4, 1, 7), "send tag 7");
        sleep_ms(4000); /* past rank 1's timeout, and its report */
        int rc = dt_barrier(c);
        CHECK(rc != 0, "the barrier after rank 1's timeout succeeded");
        CHECK_ERR(rc, dt_comm_error(c), "tagged 8");
    } else if (rank == 1) {
        int rc = recv_tag(c, y, 4, 0, 8);
        MUST_FAIL(c, rc, DT_ERR_TIMEOUT, "waiting for rank 0 to send a message tagged 8",
                  "messages from rank 0 passed over: tagged 7 (16 bytes)");
    }
}

static void mode_size(dt_comm *c)
{
    enum { N = 2000 };
    int32_t *a = drawn(1, 0, 0, N), b[5] = {1, 2, 3, 4, 5}, y[5];
    if (rank == 0) {
        dt_request *r[2];
        must(c, isend(c, a, N, 1, 1, &r[0]), "dt_isend_tag 1");
        must(c, isend(c, b, 5, 1, 2, &r[1]), "dt_isend_tag 2");
        int rc = dt_wait(r[0]), rc2 = dt_wait(r[1]);
        if (rc == 0) rc = rc2;
        if (rc == 0) rc = dt_barrier(c);
        CHECK(rc != 0, "the sends and the barrier succeeded");
        CHECK_ERR(rc, dt_comm_error(c), "ranks disagree on the count: ours 3, rank 0's 2000");
    } else if (rank == 1) {
        must(c, recv_tag(c, y, 5, 0, 2), "recv tag 2");
        CHECK(!memcmp(y, b, sizeof b), "the message tagged 2 holds %d %d %d %d %d", y[0], y[1],
              y[2], y[3], y[4]);
        int rc = recv_tag(c, y, 3, 0, 1);
        MUST_FAIL(c, rc, DT_ERR_MISMATCH, "ranks disagree on the count: ours 3, rank 0's 2000");
    }
    free(a);
}

/* 1000 messages of 2000 bytes tagged 1 (streamed, even with cross-memory
 * attach forced from 4 KiB) ahead of rank 1's receive tagged 2. */
static void mode_limit(dt_comm *c)
{
    enum { MSGS = 1000, N = 500 };
    int32_t m[N] = {0};
    if (rank == 0) {
        int rc = 0;
        for (int k = 0; k < MSGS && rc == 0; k++) rc = send_tag(c, m, N, 1, 1);
        if (rc == 0) rc = send_tag(c, m, N, 1, 2);
        if (rc == 0) rc = dt_barrier(c);
        CHECK(rc != 0, "every send and the barrier succeeded");
        CHECK_ERR(rc, dt_comm_error(c), "DTRAIN_P2P_QUEUE_MB");
    } else if (rank == 1) {
        int rc = recv_tag(c, m, N, 0, 2);
        MUST_FAIL(c, rc, DT_ERR_NOMEM, "rank 0's message tagged 1 (2000 bytes)", "1 MiB allowed",
                  "DTRAIN_P2P_QUEUE_MB");
    }
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "orders";
    if (!strcmp(mode, "timeout")) setenv("DTRAIN_TIMEOUT", "2", 1);
    if (!strcmp(mode, "limit")) setenv("DTRAIN_P2P_QUEUE_MB", "1", 1);
    dt_comm *c, *sync;
    if (dt_comm_init(&c) != 0) {
        fprintf(stderr, "dt_comm_init: %s\n", dt_last_error());
        return 1;
    }
    rank = dt_comm_rank(c);
    size = dt_comm_size(c);
    check_set_label("rank %d: ", rank);
    int need = !strcmp(mode, "orders") ? 3 : 2;
    if (size < need || size > MAX_RANKS) {
        fprintf(stderr, "test_p2p_tags %s: needs %d to %d ranks, not %d\n", mode, need, MAX_RANKS,
                size);
        return 2;
    }
    if (!strcmp(mode, "orders")) {
        must(c, dt_comm_split(c, 0, rank, &sync), "dt_comm_split");
        run_orders(c, sync);
        dt_comm_destroy(sync);
    } else if (!strcmp(mode, "never")) {
        mode_never(c);
    } else if (!strcmp(mode, "left")) {
        mode_left(c);
    } else if (!strcmp(mode, "timeout")) {
        mode_timeout(c);
    } else if (!strcmp(mode, "size")) {
        mode_size(c);
    } else if (!strcmp(mode, "limit")) {
        mode_limit(c);
    } else {
        fprintf(stderr, "usage: test_p2p_tags [never|left|timeout|size|limit]\n");
        return 2;
    }
    printf("test_p2p_tags %s: rank %d of %d over %s: %ld checks, %d failed\n", mode, rank, size,
           dt_comm_transport(c), checks, failures);
    dt_comm_destroy(c);
    return failures ? 1 : 0;
}
