/*
 * Failure behaviour, seen from inside a job: every rank runs this program
 * under `dtrain launch`, and the tests/comm/fault_*.sh scripts break the job
 * from outside (kill, stop, wrong secret) or make the ranks disagree from
 * inside (the mismatch modes), then read what each rank printed.
 *
 * Usage: test_faults MODE [ARGS]
 *   stream N [EVERY]  N all-reduces of 1 MiB of f32, a progress line on
 *                     stdout after the first and then every EVERY (default
 *                     50); each result is checked. With DTRAIN_FAULT_UNTIL
 *                     set to a path, it goes on past N until that file
 *                     exists, so a script decides when the job ends.
 *   mismatch [COUNT]  dt_allreduce of COUNT f32 (default 1024); rank 1
 *                     passes COUNT + 1.
 *   dtype-mismatch [COUNT]  rank 1 passes DT_I32 where the others pass
 *                     DT_F32: the same bytes, so only the header can tell.
 *   root-mismatch [COUNT]   dt_broadcast from root 0; rank 1 says root 1.
 *   coll-mismatch [COUNT]   rank 1 calls dt_allgather, the others
 *                     dt_allreduce.
 *   alltoallv-mismatch [COUNT]  dt_alltoallv of COUNT f32 to every peer;
 *                     rank 1 sends rank 0 COUNT + 1 (rank 0 expects COUNT).
 *   alltoallv-zero-mismatch [COUNT]  the same, but rank 1 sends rank 0
 *                     nothing (a zero count, which moves no payload).
 *   join              dt_comm_init, a barrier, dt_comm_destroy (the rogue
 *                     process of fault_secret.sh).
 *   leave LEAVER [N]  N all-reduces (default 5) and a barrier; then rank
 *                     LEAVER calls dt_comm_destroy and stays alive (until
 *                     DTRAIN_FAULT_UNTIL exists, at most 60 s), while the
 *                     others call one more all-reduce, which must fail:
 *                     each prints `rank R: leave: failed after S s`, then
 *                     its error line.
 *   leave-clean LEAVER [N]  N all-reduces; rank LEAVER destroys its
 *                     communicator at once, the others a second later:
 *                     a clean end, which must succeed everywhere.
 *
 * The contract the scripts check: on the first error a rank prints exactly
 * one line, `rank R: error: <dt_comm_error text>`, on stderr and exits 3.
 * A mismatched call that returns 0 is a library bug, reported as
 * `rank R: FAIL: ...` with exit 1 and never as a result.
 *
 * With DTRAIN_FAULT_PIDDIR set, each rank first writes its pid to
 * DIR/rankR.pid, so that a script can signal one particular rank.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/comm.h"

#define EXIT_COMM_ERROR 3
#define EXIT_BUG 1

static int rank = -1, size;

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s stream N [EVERY] | mismatch [COUNT] | dtype-mismatch [COUNT] |\n"
            "       root-mismatch [COUNT] | coll-mismatch [COUNT] |\n"
            "       alltoallv-mismatch [COUNT] | alltoallv-zero-mismatch [COUNT] | join |\n"
            "       leave LEAVER [N] | leave-clean LEAVER [N]\n",
            prog);
    exit(2);
}

/* One write() per line: the ranks share the launcher's stderr, and a line
 * written in pieces could interleave with another rank's. */
static void say(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int fd, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    for (int off = 0; off < n;) {
        ssize_t w = write(fd, line + off, (size_t)(n - off));
        if (w <= 0) return;
        off += (int)w;
    }
}

/* The error line comes first, so that it is out even if what follows
 * hangs. Then the communicator is destroyed, as a careful program would:
 * on a failed job that must return at once (a hang here is a bug the
 * scripts catch by the job's time limit), and it joins the library's
 * threads, which ThreadSanitizer would otherwise report as leaked. exit()
 * rather than _exit(), so the sanitizers' exit checks still run. */
static void comm_error(dt_comm *c)
{
    say(2, "rank %d: error: %s", rank, dt_comm_error(c));
    dt_comm_destroy(c);
    exit(EXIT_COMM_ERROR);
}

static void bug(const char *what, const char *detail)
{
    say(2, "rank %d: FAIL: %s%s", rank, what, detail);
    exit(EXIT_BUG);
}

/* Written to a temporary name and renamed, so a script polling for the
 * file never reads half a pid. */
static void write_pid_file(void)
{
    const char *dir = getenv("DTRAIN_FAULT_PIDDIR");
    const char *r = getenv("RANK");
    if (!dir || !*dir) return;
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/rank%s.pid", dir, r ? r : "0");
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%ld\n", (long)getpid()) < 0 || fclose(f) != 0 || rename(tmp, path)) {
        perror(tmp);
        exit(2);
    }
}

static size_t parse_count(const char *s, const char *prog)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v == 0 || v > ((size_t)1 << 30)) usage(prog);
    return (size_t)v;
}

/* ---- stream -------------------------------------------------------------- */

/* Inputs are small integers, so every sum is exact and a single wrong
 * element is a real corruption, not rounding. */
static float stream_input(int r, size_t i, long iter) { return (float)((r + i + (size_t)iter) % 8); }

/* Whether the stream should go on past its N iterations: until the file
 * exists, as seen by any rank. The ranks agree through an all-reduce, as
 * they would drift apart by an iteration if each looked for itself. */
static int keep_going(dt_comm *c, const char *until)
{
    if (!until) return 0;
    int32_t absent = access(until, F_OK) != 0, all = 0;
    int rc = dt_allreduce(c, &absent, &all, 1, DT_I32, DT_MIN);
    if (rc != 0) comm_error(c);
    return all;
}

static void stream(dt_comm *c, long n, long every)
{
    enum { COUNT = (1 << 20) / sizeof(float) };
    const char *until = getenv("DTRAIN_FAULT_UNTIL");
    if (until && !*until) until = NULL;
    float *buf = malloc(COUNT * sizeof *buf);
    if (!buf) bug("out of memory", "");
    long it;
    for (it = 0; it < n || keep_going(c, until); it++) {
        for (size_t i = 0; i < COUNT; i++) buf[i] = stream_input(rank, i, it);
        int rc = dt_allreduce(c, buf, buf, COUNT, DT_F32, DT_SUM);
        if (rc != 0) comm_error(c);
        /* A sample (a stride prime to the ring's chunking) keeps the check
         * cheap next to the all-reduce, so the stream stays communication. */
        for (size_t i = 0; i < COUNT; i += 61) {
            float want = 0;
            for (int r = 0; r < size; r++) want += stream_input(r, i, it);
            if (buf[i] != want) {
                char d[160];
                snprintf(d, sizeof d, "iteration %ld: element %zu is %g, expected %g", it, i,
                         (double)buf[i], (double)want);
                bug("stream: wrong all-reduce result: ", d);
            }
        }
        if (it == 0 || (it + 1) % every == 0)
            say(1, "rank %d: stream: %ld all-reduces done", rank, it + 1);
    }
    free(buf);
    say(1, "rank %d: stream: finished %ld all-reduces over %s", rank, it, dt_comm_transport(c));
}

/* ---- mismatches ------------------------------------------------------------ */

/* Every rank must fail the mismatched call; one that returns 0 would hand
 * its caller a result computed from disagreeing inputs. */
static void expect_failure(dt_comm *c, int rc, const char *call)
{
    if (rc != 0) comm_error(c);
    bug(call, " returned 0 although the ranks disagree");
}

static void mismatch(dt_comm *c, const char *mode, size_t count)
{
    /* Room for the largest call any rank makes: count + 1 elements, or an
     * all-gather's size * count. */
    size_t n = (count + 1) * (size_t)(size > 1 ? size : 2);
    float *send = calloc(n, sizeof *send), *recv = calloc(n, sizeof *recv);
    if (!send || !recv) bug("out of memory", "");
    for (size_t i = 0; i < n; i++) send[i] = (float)(rank + 1);
    /* Everyone out of dt_comm_init first. Otherwise a fast rank can fail
     * and exit, taking rank 0's store with it, while a slow rank still
     * waits in init's store barrier: that rank then reports the lost store,
     * not the mismatch under test. */
    int rc = dt_barrier(c);
    if (rc != 0) comm_error(c);
    int odd = rank == 1;
    if (!strcmp(mode, "mismatch")) {
        expect_failure(c, dt_allreduce(c, send, recv, count + (odd ? 1 : 0), DT_F32, DT_SUM),
                       "dt_allreduce with rank 1's count one larger");
    } else if (!strcmp(mode, "dtype-mismatch")) {
        expect_failure(c, dt_allreduce(c, send, recv, count, odd ? DT_I32 : DT_F32, DT_SUM),
                       "dt_allreduce with rank 1 passing i32 for f32");
    } else if (!strcmp(mode, "root-mismatch")) {
        /* Ranks that each think they are the root only send, so no one can
         * see the disagreement inside the call; the stale message it leaves
         * fails the next call on the communicator (the library's contract).
         * Either way, no rank may get through both calls without an error. */
        rc = dt_broadcast(c, send, recv, count, DT_F32, odd ? 1 : 0);
        if (rc == 0) rc = dt_barrier(c);
        expect_failure(c, rc, "dt_broadcast with rank 1 claiming to be the root, then dt_barrier");
    } else if (!strcmp(mode, "coll-mismatch")) {
        rc = odd ? dt_allgather(c, send, recv, count, DT_F32)
                 : dt_allreduce(c, send, recv, count, DT_F32, DT_SUM);
        expect_failure(c, rc, odd ? "dt_allgather (others called dt_allreduce)"
                                  : "dt_allreduce (rank 1 called dt_allgather)");
    }
    free(send);
    free(recv);
}

/* COUNT f32 to and from every peer, packed in rank order; rank 1 sends
 * rank 0 COUNT + 1 (or none, with `zero`) where rank 0 expects COUNT. Every
 * buffer has room for COUNT + 1 a peer, so only the counts disagree, and
 * a canary after rank 0's block from rank 1 must survive: the receiver may
 * never write past its own count. Ranks 0 and 1 must both fail the call. */
static void alltoallv_mismatch(dt_comm *c, size_t count, int zero)
{
    size_t p = (size_t)size, slot = count + 1;
    size_t *v = calloc(4 * p, sizeof *v);
    float *send = calloc(p * slot, sizeof *send), *recv = calloc(p * slot, sizeof *recv);
    if (!v || !send || !recv) bug("out of memory", "");
    for (size_t j = 0; j < p; j++) {
        v[j] = v[2 * p + j] = count;
        v[p + j] = v[3 * p + j] = j * slot;
    }
    if (rank == 1) v[0] = zero ? 0 : count + 1;
    for (size_t i = 0; i < p * slot; i++) send[i] = (float)(rank + 1);
    const float canary = -7;
    recv[1 * slot + count] = canary;
    int rc = dt_barrier(c); /* everyone out of dt_comm_init first (see mismatch) */
    if (rc != 0) comm_error(c);
    rc = dt_alltoallv(c, send, v, v + p, recv, v + 2 * p, v + 3 * p, DT_F32);
    if (rank == 0 && recv[1 * slot + count] != canary)
        bug("dt_alltoallv: ", "rank 0 wrote past its count for rank 1's block");
    /* The pair fails in the call itself; a rank outside it may get its
     * (correct) blocks first and then hear of the job's abort. */
    if (rc == 0 && rank > 1) rc = dt_barrier(c);
    expect_failure(c, rc, rank > 1 ? "dt_alltoallv, then dt_barrier, after ranks 1 and 0 "
                                     "disagreed on their counts"
                                   : "dt_alltoallv with rank 1 sending rank 0 another count "
                                     "than it expects");
}

/* ---- a rank that leaves ----------------------------------------------------- */

static void allreduces(dt_comm *c, long n)
{
    int32_t v[1024];
    for (long it = 0; it < n; it++) {
        for (int i = 0; i < 1024; i++) v[i] = rank + i;
        if (dt_allreduce(c, v, v, 1024, DT_I32, DT_SUM) != 0) comm_error(c);
    }
}

static void wait_for_stop(double limit_s)
{
    const char *until = getenv("DTRAIN_FAULT_UNTIL");
    for (double t = 0; t < limit_s && !(until && *until && access(until, F_OK) == 0); t += 0.05)
        usleep(50000);
}

static void leave(dt_comm *c, int leaver, long n, int clean)
{
    if (leaver >= size) bug("leave: LEAVER is not a rank of the job", "");
    allreduces(c, n);
    if (clean) {
        if (rank != leaver) usleep(1000000);
        dt_comm_destroy(c);
        say(1, "rank %d: leave-clean: done", rank);
        exit(0);
    }
    if (dt_barrier(c) != 0) comm_error(c);
    if (rank == leaver) {
        say(1, "rank %d: leave: leaving after %ld all-reduces", rank, n);
        dt_comm_destroy(c);
        say(1, "rank %d: leave: left; still running", rank);
        wait_for_stop(60);
        exit(0);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int32_t v[1024] = {0};
    int rc = dt_allreduce(c, v, v, 1024, DT_I32, DT_SUM);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == 0) bug("leave: ", "the all-reduce after a rank left returned 0");
    say(1, "rank %d: leave: failed after %.2f s", rank,
        (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    comm_error(c);
}

int main(int argc, char **argv)
{
    if (argc < 2) usage(argv[0]);
    const char *mode = argv[1];
    long n = 0, every = 50, leaver = 0;
    size_t count = 1024;
    if (!strcmp(mode, "stream")) {
        if (argc < 3 || argc > 4) usage(argv[0]);
        n = (long)parse_count(argv[2], argv[0]);
        if (argc == 4) every = (long)parse_count(argv[3], argv[0]);
    } else if (!strcmp(mode, "mismatch") || !strcmp(mode, "dtype-mismatch") ||
               !strcmp(mode, "root-mismatch") || !strcmp(mode, "coll-mismatch") ||
               !strcmp(mode, "alltoallv-mismatch") || !strcmp(mode, "alltoallv-zero-mismatch")) {
        if (argc > 3) usage(argv[0]);
        if (argc == 3) count = parse_count(argv[2], argv[0]);
    } else if (!strcmp(mode, "leave") || !strcmp(mode, "leave-clean")) {
        if (argc < 3 || argc > 4) usage(argv[0]);
        char *end;
        leaver = strtol(argv[2], &end, 10);
        if (*argv[2] == '\0' || *end != '\0' || leaver < 0) usage(argv[0]);
        n = argc == 4 ? (long)parse_count(argv[3], argv[0]) : 5;
    } else if (strcmp(mode, "join") || argc != 2) {
        usage(argv[0]);
    }
    write_pid_file();

    dt_comm *c;
    int rc = dt_comm_init(&c);
    if (rc != 0) {
        const char *r = getenv("RANK");
        /* stdout carries the code, so the one error line stays exactly one. */
        say(1, "rank %s: dt_comm_init returned %d (%s)", r ? r : "?", rc, dt_strerror(rc));
        say(2, "rank %s: error: %s", r ? r : "?", dt_last_error());
        return EXIT_COMM_ERROR;
    }
    rank = dt_comm_rank(c);
    size = dt_comm_size(c);
    if (size < 2 && strcmp(mode, "stream") && strcmp(mode, "join"))
        bug(mode, " needs at least 2 ranks (rank 1 is the odd one out)");

    if (!strcmp(mode, "stream")) {
        stream(c, n, every);
    } else if (!strcmp(mode, "leave") || !strcmp(mode, "leave-clean")) {
        leave(c, (int)leaver, n, !strcmp(mode, "leave-clean"));
    } else if (!strcmp(mode, "join")) {
        rc = dt_barrier(c);
        if (rc != 0) comm_error(c);
        say(1, "rank %d: join: joined a job of %d ranks", rank, size);
    } else if (!strncmp(mode, "alltoallv-", 10)) {
        alltoallv_mismatch(c, count, !strcmp(mode, "alltoallv-zero-mismatch"));
    } else {
        mismatch(c, mode, count);
    }
    dt_comm_destroy(c);
    return 0;
}
