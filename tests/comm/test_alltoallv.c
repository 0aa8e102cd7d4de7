/*
 * The variable all-to-all (dt_alltoallv, dt_ialltoallv) against a serial
 * reference, run by every rank of a job (start it with `dtrain launch -n
 * N`, or under mpirun). Every rank draws the whole job's count matrix from
 * a seed they share, so each knows what every peer sends it without
 * asking the library: uneven counts with zeros, a rank that sends nothing
 * at all, a rank that receives nothing, blocks in a shuffled order with
 * gaps between them (which must come back untouched), large blocks for
 * the transports' bulk paths and blocks past 4 MiB, written past the cache. Every dtype, every algorithm forced (and
 * ranks forcing different ones), auto, the non-blocking twin overlapped
 * with other collectives, the payload counted (zero counts move none),
 * and every argument check, after each of which the communicator must
 * still work. With DTRAIN_TEST_COMM_MEM=1 the buffers are communication
 * memory, pulled through peers' mappings, and freed and allocated again.
 *
 * Usage: test_alltoallv [--mpi]   (--mpi: MPI's algorithm too; needs mpirun)
 * With DTRAIN_ALLTOALLV_ALGO set, auto must report that algorithm.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h" /* tests/check.h */
#include "comm/reduce_ops.h"
#include "draw.h" /* tests/comm/draw.h */
#include "dtrain/comm.h"

static int rank, size;
/* DTRAIN_TEST_COMM_MEM=1: the buffers are communication memory
 * (dt_comm_mem_alloc), which local peers pull through a mapping. */
static int comm_mem;

static void *buf_alloc(size_t bytes) { return comm_mem ? dt_comm_mem_alloc(bytes) : calloc(bytes, 1); }

static void buf_free(void *p)
{
    if (comm_mem)
        dt_comm_mem_free(p);
    else
        free(p);
}

static void must(dt_comm *c, int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "rank %d: %s%s returned %d (%s): %s\n", rank, check_label, what, rc,
                dt_strerror(rc), dt_comm_error(c));
        exit(1);
    }
}

/* ---- the job's counts and this rank's layout, from the seed ----------------- */

typedef struct {
    uint64_t seed;
    size_t most;  /* counts are 0..most (0: every count is zero) */
    size_t big;   /* one pair in four moves this many more (0: none) */
    int quiet;    /* this rank sends nothing at all (-1: none) */
    int deaf;     /* this rank receives nothing at all (-1: none) */
    int dense;    /* every pair moves big more: no zeros */
} pattern;

/* Elements rank i sends rank j: a third of the pairs zero. */
static size_t count_of(const pattern *pt, int i, int j)
{
    if (i == pt->quiet || j == pt->deaf || pt->most == 0) return 0;
    uint64_t h = draw(pt->seed, (uint64_t)i, (uint64_t)j, 1);
    if (h % 3 == 0 && !pt->dense) return 0;
    size_t n = 1 + (size_t)(h >> 8) % pt->most;
    if (pt->big && (pt->dense || (h >> 40) % 4 == 0)) n += pt->big;
    return n;
}

/* This rank's side of the call: blocks in a shuffled order with gaps of
 * 0..2 elements before each; len the elements the buffer spans. */
typedef struct {
    size_t *counts, *displs;
    size_t len;
} side;

static side side_of(const pattern *pt, int send)
{
    side s = {calloc((size_t)size, sizeof(size_t)), calloc((size_t)size, sizeof(size_t)), 0};
    int *order = malloc((size_t)size * sizeof *order);
    for (int j = 0; j < size; j++) order[j] = j;
    for (int j = size - 1; j > 0; j--) { /* Fisher-Yates, by the seed */
        int k = (int)(draw(pt->seed, (uint64_t)rank, (uint64_t)j, 2 + (uint64_t)send) %
                      (uint64_t)(j + 1));
        int t = order[j];
        order[j] = order[k];
        order[k] = t;
    }
    for (int k = 0; k < size; k++) {
        int j = order[k];
        s.len += draw(pt->seed, (uint64_t)rank, (uint64_t)j, 4 + (uint64_t)send) % 3;
        s.counts[j] = send ? count_of(pt, rank, j) : count_of(pt, j, rank);
        s.displs[j] = s.len;
        s.len += s.counts[j];
    }
    free(order);
    return s;
}

static void side_free(side *s)
{
    free(s->counts);
    free(s->displs);
}

/* ---- values -------------------------------------------------------------------- */

/* Element e of what rank i sends rank j: a small integer, exact in every dtype. */
static double value(int i, int j, size_t e, dt_dtype t)
{
    int v = (int)((size_t)(i * 7 + j * 3) + e) % 11;
    return t == DT_U8 ? v : v - 5;
}

static void put(dt_dtype t, void *buf, size_t i, double v)
{
    switch (t) {
    case DT_F32: ((float *)buf)[i] = (float)v; break;
    case DT_F64: ((double *)buf)[i] = v; break;
    case DT_BF16: ((uint16_t *)buf)[i] = dt_f32_to_bf16((float)v); break;
    case DT_F16: ((uint16_t *)buf)[i] = dt_f32_to_f16((float)v); break;
    case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DT_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: break;
    }
}

static double get(dt_dtype t, const void *buf, size_t i)
{
    switch (t) {
    case DT_F32: return ((const float *)buf)[i];
    case DT_F64: return ((const double *)buf)[i];
    case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DT_F16: return dt_f16_to_f32(((const uint16_t *)buf)[i]);
    case DT_I32: return ((const int32_t *)buf)[i];
    case DT_I64: return (double)((const int64_t *)buf)[i];
    case DT_U8: return ((const uint8_t *)buf)[i];
    default: return 0;
    }
}

#define POISON 0xa5

/* One call's buffers and arrays, filled from the pattern. */
typedef struct {
    pattern pt;
    dt_dtype t;
    side s, r;
    char *send, *recv;
} call;

static void call_make(call *k, const pattern *pt, dt_dtype t)
{
    size_t esz = dt_dtype_size(t);
    k->pt = *pt;
    k->t = t;
    k->s = side_of(pt, 1);
    k->r = side_of(pt, 0);
    k->send = buf_alloc((k->s.len + 1) * esz);
    k->recv = buf_alloc((k->r.len + 1) * esz);
    memset(k->recv, POISON, (k->r.len + 1) * esz);
    for (int j = 0; j < size; j++)
        for (size_t e = 0; e < k->s.counts[j]; e++)
            put(t, k->send, k->s.displs[j] + e, value(rank, j, e, t));
}

static void call_free(call *k)
{
    side_free(&k->s);
    side_free(&k->r);
    buf_free(k->send);
    buf_free(k->recv);
}

static int call_run(dt_comm *c, call *k, dt_request **req)
{
    if (req)
        return dt_ialltoallv(c, k->send, k->s.counts, k->s.displs, k->recv, k->r.counts,
                             k->r.displs, k->t, req);
    return dt_alltoallv(c, k->send, k->s.counts, k->s.displs, k->recv, k->r.counts,
                        k->r.displs, k->t);
}

/* Every received element against the reference, and every byte between
 * the blocks still the poison; the send buffer unchanged. */
static void call_check(const call *k, const char *what)
{
    size_t esz = dt_dtype_size(k->t);
    unsigned char *mine = calloc(k->r.len + 1, 1);
    for (int j = 0; j < size; j++) {
        CHECK(k->r.counts[j] == count_of(&k->pt, j, rank), "%s: layout", what);
        for (size_t e = 0; e < k->r.counts[j]; e++) {
            size_t at = k->r.displs[j] + e;
            double got = get(k->t, k->recv, at), want = value(j, rank, e, k->t);
            mine[at] = 1;
            CHECK(got == want, "%s %s: element %zu of the block from rank %d (of %zu) is %g, "
                  "expected %g", what, dt_dtype_name(k->t), e, j, k->r.counts[j], got, want);
            if (got != want) break;
        }
    }
    for (size_t at = 0; at <= k->r.len; at++) {
        if (mine[at]) continue;
        int clean = 1;
        for (size_t b = 0; b < esz; b++) clean &= (unsigned char)k->recv[at * esz + b] == POISON;
        CHECK(clean, "%s %s: element %zu of recv lies in no block but was written", what,
              dt_dtype_name(k->t), at);
        if (!clean) break;
    }
    for (int j = 0; j < size; j++)
        for (size_t e = 0; e < k->s.counts[j]; e += 7)
            CHECK(get(k->t, k->send, k->s.displs[j] + e) == value(rank, j, e, k->t),
                  "%s: the send buffer changed", what);
    free(mine);
}

/* Payload bytes this rank's call must send: its blocks for the others. */
static uint64_t payload(const call *k)
{
    uint64_t n = 0;
    for (int j = 0; j < size; j++)
        if (j != rank) n += k->s.counts[j];
    return n * dt_dtype_size(k->t);
}

/* One blocking call of the pattern, checked; the payload counted unless
 * MPI's own collective moved it. */
static void one_call(dt_comm *c, const pattern *pt, dt_dtype t, int counted, const char *what)
{
    call k;
    call_make(&k, pt, t);
    uint64_t before = dt_comm_bytes_sent(c);
    must(c, call_run(c, &k, NULL), what);
    uint64_t sent = dt_comm_bytes_sent(c) - before;
    call_check(&k, what);
    if (counted)
        CHECK(sent == payload(&k), "%s %s: %llu payload bytes sent, expected %llu (zero counts "
              "move none)", what, dt_dtype_name(t), (unsigned long long)sent,
              (unsigned long long)payload(&k));
    call_free(&k);
}

/* The patterns every algorithm meets. */
static void patterns(dt_comm *c, int counted, const char *algo)
{
    char what[128];
    for (int t = 0; t < DT_DTYPE_COUNT; t++)
        for (uint64_t s = 1; s <= 3; s++) {
            /* small random counts; then rank s % size sends nothing and
             * rank (s + 1) % size receives nothing */
            pattern pt = {s * 31 + (uint64_t)t, 40, 0, -1, -1, 0};
            if (s >= 2) pt.quiet = (int)(s % (uint64_t)size);
            if (s == 3) pt.deaf = (int)((s + 1) % (uint64_t)size);
            snprintf(what, sizeof what, "alltoallv (%s, seed %llu)", algo,
                     (unsigned long long)pt.seed);
            one_call(c, &pt, (dt_dtype)t, counted, what);
        }
    /* Every count zero: nothing moves, nothing is written. */
    pattern none = {77, 0, 0, -1, -1, 0};
    snprintf(what, sizeof what, "alltoallv (%s, every count zero)", algo);
    one_call(c, &none, DT_I32, counted, what);
    /* Blocks past the shared-memory rings and the CMA threshold. */
    pattern large = {99, 50, 300000, -1, -1, 0};
    snprintf(what, sizeof what, "alltoallv (%s, large blocks)", algo);
    one_call(c, &large, DT_F32, counted, what);
}

/* Every block past DT_STREAM_MIN (4 MiB), the rank's own included: the
 * outputs written past the cache. */
static void huge_blocks(dt_comm *c)
{
    pattern huge = {111, 50, (4u << 20) / sizeof(float) + 1000, -1, -1, 1};
    one_call(c, &huge, DT_F32, 1, "alltoallv (auto, blocks of 4 MiB and more)");
}

/* ---- communication memory ------------------------------------------------------- */

/* Our read-only mappings of peers' communication memory ("r--s": our own
 * regions are mapped read-write). */
static int peer_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, "dtrain-comm-mem") && strstr(line, " r--s ");
    if (f) fclose(f);
    return n;
}

/* Buffers freed and allocated again round after round, as a step's may
 * be: each round's payload right though a new region may reuse a freed
 * one's descriptor number; each peer's region mapped once it sent from it
 * (or never, where DTRAIN_SHM_MAP=0 has it pulled by cross-memory attach),
 * and the freed ones let go: one a peer at most, its last. */
static void regions(dt_comm *c)
{
    const char *no_map = getenv("DTRAIN_SHM_MAP");
    int expect = strcmp(dt_comm_transport(c), "shm") || (no_map && !strcmp(no_map, "0"))
                     ? 0 : size - 1;
    char what[96];
    for (int round = 0; round < 5; round++) {
        pattern pt = {900 + (uint64_t)round, 50, 20000 + 7000 * (size_t)round, -1, -1, 1};
        snprintf(what, sizeof what, "alltoallv (communication memory, round %d)", round);
        call k;
        call_make(&k, &pt, DT_F32);
        must(c, call_run(c, &k, NULL), what);
        call_check(&k, what);
        int maps = peer_mappings();
        CHECK(maps == expect, "%s: %d mappings of peers' communication memory, expected %d",
              what, maps, expect);
        call_free(&k);
        must(c, dt_barrier(c), "dt_barrier after a round");
    }
}

/* ---- the non-blocking twin among other collectives ----------------------------- */

static void nonblocking(dt_comm *c)
{
    pattern a = {501, 60, 0, -1, -1, 0}, b = {502, 60, 70000, 1 % size, -1, 0};
    call ka, kb;
    call_make(&ka, &a, DT_F32);
    call_make(&kb, &b, DT_I64);
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (float)(rank + i);
    int32_t mine = rank, all[64];
    dt_request *r1, *r2, *r3;
    must(c, call_run(c, &ka, &r1), "dt_ialltoallv");
    must(c, dt_iallreduce(c, x, y, 64, DT_F32, DT_SUM, &r2), "dt_iallreduce");
    must(c, call_run(c, &kb, &r3), "dt_ialltoallv (second)");
    must(c, dt_allgather(c, &mine, all, 1, DT_I32), "dt_allgather behind them");
    must(c, dt_wait(r3), "dt_wait(ialltoallv, second)");
    must(c, dt_wait(r1), "dt_wait(ialltoallv)");
    must(c, dt_wait(r2), "dt_wait(iallreduce)");
    call_check(&ka, "ialltoallv");
    call_check(&kb, "ialltoallv (second)");
    for (int i = 0; i < 64; i++) {
        float want = 0;
        for (int r = 0; r < size; r++) want += (float)(r + i);
        CHECK(y[i] == want, "iallreduce between ialltoallvs: element %d is %g, expected %g", i,
              y[i], want);
    }
    for (int r = 0; r < size && r < 64; r++)
        CHECK(all[r] == r, "allgather behind ialltoallv: %d, expected %d", all[r], r);
    call_free(&ka);
    call_free(&kb);
}

/* ---- argument checks ---------------------------------------------------------------- */

static void expect_invalid(dt_comm *c, int rc, const char *want, const char *what)
{
    CHECK(rc == DT_ERR_INVALID, "%s: returned %d, expected DT_ERR_INVALID", what, rc);
    CHECK(strstr(dt_comm_error(c), want), "%s: message '%s' lacks '%s'", what,
          dt_comm_error(c), want);
}

static void bad_arguments(dt_comm *c)
{
    size_t p = (size_t)size;
    size_t *n = malloc(4 * p * sizeof *n), *sd = n + p, *rn = n + 2 * p, *rd = n + 3 * p;
    float *s = calloc(4 * p + 4, sizeof *s), *r = calloc(4 * p + 4, sizeof *r);
    for (size_t j = 0; j < p; j++) n[j] = rn[j] = 2, sd[j] = rd[j] = 2 * j;
    dt_request *q = NULL;
    expect_invalid(c, dt_alltoallv(c, s, NULL, sd, r, rn, rd, DT_F32), "send_counts is NULL",
                   "NULL send_counts");
    expect_invalid(c, dt_ialltoallv(c, s, n, sd, r, rn, NULL, DT_F32, &q),
                   "recv_displs is NULL", "NULL recv_displs");
    CHECK(q == NULL, "a refused dt_ialltoallv left a request");
    expect_invalid(c, dt_alltoallv(c, NULL, n, sd, r, rn, rd, DT_F32),
                   "send buffer is NULL with send_counts[0] = 2", "NULL send");
    expect_invalid(c, dt_alltoallv(c, s, n, sd, r, rn, rd, (dt_dtype)99), "not a dt_dtype",
                   "bad dtype");
    expect_invalid(c, dt_alltoallv(c, s, n, sd, s, rn, rd, DT_F32), "no in-place form",
                   "send == recv");
    rn[rank] = 3;
    expect_invalid(c, dt_alltoallv(c, s, n, sd, r, rn, rd, DT_F32), "sends itself 2 elements",
                   "own counts differ");
    rn[rank] = 2;
    rd[p - 1] = SIZE_MAX - 1;
    expect_invalid(c, dt_alltoallv(c, s, n, sd, r, rn, rd, DT_F32), "overflows the address space",
                   "displacement past the address space");
    rd[p - 1] = 2 * (p - 1);
    if (size > 1) {
        rd[1] = 1; /* rank 1's block starts inside rank 0's */
        expect_invalid(c, dt_alltoallv(c, s, n, sd, r, rn, rd, DT_F32),
                       "from rank 0 (elements 0..1) and rank 1 (elements 1..2) overlap",
                       "overlapping receive blocks");
        rd[1] = 2;
    }
    /* One buffer: sends at its start, receives an element later, so that they meet. */
    expect_invalid(c, dt_alltoallv(c, s, n, sd, s + 1, rn, rd, DT_F32), "overlaps the send block",
                   "receive block over a send block");
    /* Disjoint parts of one buffer are fine. */
    must(c, dt_alltoallv(c, s, n, sd, s + 2 * p, rn, rd, DT_F32),
         "dt_alltoallv into the second half of the send buffer");
    CHECK(dt_ialltoallv(c, s, n, sd, r, rn, rd, DT_F32, NULL) == DT_ERR_INVALID,
          "dt_ialltoallv without a request pointer");
    free(n);
    free(s);
    free(r);
}

/* ---- names, forcing, auto --------------------------------------------------------- */

static int algorithms(int with_mpi, const char **out)
{
    const char *names[16];
    int n = dt_comm_algo_names("alltoallv", names, 16), k = 0;
    CHECK(n == 3 && !strcmp(names[0], "linear") && !strcmp(names[1], "pairwise") &&
          !strcmp(names[2], "mpi"), "dt_comm_algo_names(alltoallv): %d names", n);
    for (int i = 0; i < n && i < 16; i++)
        if (with_mpi || strcmp(names[i], "mpi")) out[k++] = names[i];
    return k;
}

static void names_and_auto(dt_comm *c)
{
    const char *env = getenv("DTRAIN_ALLTOALLV_ALGO");
    for (size_t n = 1; n <= ((size_t)1 << 24); n *= 64) {
        const char *got = dt_comm_algo_for(c, "alltoallv", n, DT_F32);
        CHECK(got != NULL, "dt_comm_algo_for(alltoallv, %zu) is NULL", n);
        if (got && size > 1 && env)
            CHECK(!strcmp(got, env), "DTRAIN_ALLTOALLV_ALGO=%s, but %zu elements run %s", env, n,
                  got);
        if (got && size == 1) CHECK(!strcmp(got, "self"), "one rank runs %s", got);
        double us = dt_comm_predict_us(c, "alltoallv", "linear", n, DT_F32);
        CHECK(size == 1 || us > 0, "predicted %g us for a linear alltoallv of %zu", us, n);
    }
    CHECK(dt_comm_set_algo(c, "alltoallv", "nope") == DT_ERR_INVALID, "algorithm 'nope' taken");
    CHECK(strstr(dt_comm_error(c), "choices: auto, linear, pairwise, mpi"),
          "message for 'nope': %s", dt_comm_error(c));
    CHECK(dt_comm_algo_summary("alltoallv", "linear") != NULL, "no summary for linear");
}

int main(int argc, char **argv)
{
    int with_mpi = argc == 2 && !strcmp(argv[1], "--mpi");
    if (argc > 2 || (argc == 2 && !with_mpi)) {
        fprintf(stderr, "usage: %s [--mpi]\n", argv[0]);
        return 2;
    }
    dt_comm *c;
    if (dt_comm_init(&c) != 0) {
        fprintf(stderr, "dt_comm_init: %s\n", dt_last_error());
        return 1;
    }
    rank = dt_comm_rank(c);
    size = dt_comm_size(c);
    const char *mem = getenv("DTRAIN_TEST_COMM_MEM");
    comm_mem = mem && !strcmp(mem, "1");
    check_set_label("rank %d: ", rank);
    names_and_auto(c);
    const char *algos[16];
    int n = algorithms(with_mpi, algos);
    for (int a = 0; a < n; a++) {
        must(c, dt_comm_set_algo(c, "alltoallv", algos[a]), "dt_comm_set_algo");
        check_set_label("rank %d: alltoallv=%s: ", rank, algos[a]);
        patterns(c, strcmp(algos[a], "mpi") != 0, algos[a]);
    }
    /* Ranks that choose differently (auto may: each sees its own counts)
     * exchange the same messages. */
    const char *mixed = algos[rank % 2];
    must(c, dt_comm_set_algo(c, "alltoallv", mixed), "dt_comm_set_algo (mixed)");
    check_set_label("rank %d: alltoallv=%s, the next rank another: ", rank, mixed);
    patterns(c, 1, "mixed");
    must(c, dt_comm_set_algo(c, "alltoallv", "auto"), "dt_comm_set_algo (auto)");
    check_set_label("rank %d: alltoallv=auto: ", rank);
    patterns(c, 1, "auto");
    huge_blocks(c);
    if (comm_mem) regions(c);
    nonblocking(c);
    bad_arguments(c);
    nonblocking(c); /* the refused calls left the communicator working */
    if (rank == 0)
        printf("test_alltoallv: %d ranks over %s: %ld checks, %d failed on rank 0\n", size,
               dt_comm_transport(c), checks, failures);
    dt_comm_destroy(c);
    return failures ? 1 : 0;
}
