/*
 * Every collective against a serial reference, run by every rank of a job
 * (start it with `dtrain launch -n N`): all dtypes and ops, counts 0, 1,
 * p-1, p, p+1 and large, in place and not, several roots. Inputs are small
 * integers, so every reduction is exact in every dtype and any difference
 * from the reference is a bug, not rounding. A second pass with random
 * floats checks that all ranks hold bit-identical results. Then
 * sub-communicators, non-blocking calls, and point-to-point.
 *
 * With --all-algos the matrix and the bit-identity check run once per
 * algorithm: pass k forces the k-th algorithm of every collective that has
 * a choice (wrapping round shorter lists), so every algorithm meets every
 * count, dtype and root, sum and avg in every dtype and every op in f32
 * and i32. MPI's algorithms join only with --mpi (the
 * job must then run under mpirun).
 *
 * Usage: test_collectives [--large N] [--quick] [--all-algos [--mpi]]
 * Exit 0 when every check passed; otherwise the first failures are printed.
 */
#include <malloc.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/reduce_ops.h"
#include "core/hash.h"
#include "check.h" /* tests/check.h */
#include "draw.h" /* tests/comm/draw.h */
#include "dtrain/comm.h"

static int rank, size;
static char algo_label[256] = ""; /* the forced algorithms, for messages */

static void must(dt_comm *c, int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "rank %d: %s%s returned %d (%s): %s\n", rank, algo_label, what, rc,
                dt_strerror(rc), dt_comm_error(c));
        exit(1);
    }
}

/* ---- typed element access ---------------------------------------------------- */

static int is_integer(dt_dtype t) { return t == DT_I32 || t == DT_I64 || t == DT_U8; }

static void put(dt_dtype t, void *buf, size_t i, double v)
{
    switch (t) {
    case DT_F32: ((float *)buf)[i] = (float)v; break;
    case DT_F64: ((double *)buf)[i] = v; break;
    case DT_BF16: ((uint16_t *)buf)[i] = dt_f32_to_bf16((float)v); break;
    case DT_F16: ((uint16_t *)buf)[i] = dt_f32_to_f16((float)v); break;
    case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DT_U8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
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

/* Rank r's i-th input: small integers that keep sums and products exact. */
static double input(int r, size_t i, dt_dtype t, dt_op op, int salt)
{
    uint64_t h = mix((uint64_t)r * 1000003u + i * 7919u + (uint64_t)t * 131u + (uint64_t)op * 17u +
                     (uint64_t)salt * 65537u);
    if (op == DT_PROD) {
        static const int vals[4] = {1, 2, -1, 1};
        return t == DT_U8 ? (double)(1 + h % 2) : vals[h % 4];
    }
    return t == DT_U8 ? (double)(h % 9) : (double)((int)(h % 9) - 4);
}

/* Serial reduction of element i over all ranks, in exact arithmetic. */
static double reference(size_t i, dt_dtype t, dt_op op, int salt)
{
    double acc = input(0, i, t, op, salt);
    for (int r = 1; r < size; r++) {
        double v = input(r, i, t, op, salt);
        switch (op) {
        case DT_SUM:
        case DT_AVG: acc += v; break;
        case DT_PROD: acc *= v; break;
        case DT_MAX: acc = v > acc ? v : acc; break;
        case DT_MIN: acc = v < acc ? v : acc; break;
        case DT_BAND: acc = (double)((int64_t)acc & (int64_t)v); break;
        case DT_BOR: acc = (double)((int64_t)acc | (int64_t)v); break;
        case DT_BXOR: acc = (double)((int64_t)acc ^ (int64_t)v); break;
        default: break;
        }
    }
    if (t == DT_U8) acc = (double)((int64_t)acc & 0xff);
    if (op == DT_AVG) {
        if (t == DT_I32 || t == DT_I64 || t == DT_U8)
            acc = (double)((int64_t)acc / size);
        else
            acc = acc / size;
    }
    return acc;
}

static int close_enough(dt_dtype t, dt_op op, double got, double want)
{
    if (op != DT_AVG || t == DT_I32 || t == DT_I64 || t == DT_U8) return got == want;
    double tol = t == DT_BF16 ? 1.0 / 128 : t == DT_F16 ? 1.0 / 1024 : t == DT_F32 ? 1e-6 : 1e-13;
    return fabs(got - want) <= tol * fabs(want) + 1e-30;
}

typedef struct {
    const char *coll;
    dt_dtype t;
    dt_op op;
    size_t count;
    int root, inplace;
} caseinfo;

static void check_elem(const caseinfo *k, size_t i, double got, double want)
{
    CHECK(close_enough(k->t, k->op, got, want),
          "%s %s %s count=%zu root=%d inplace=%d: element %zu is %g, expected %g", k->coll,
          dt_dtype_name(k->t), dt_op_name(k->op), k->count, k->root, k->inplace, i, got, want);
}

/* DTRAIN_TEST_COMM_MEM=1: the buffers are communication memory
 * (dt_comm_mem_alloc), which local peers pull through a mapping,
 * reductions included. */
static int comm_mem(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DTRAIN_TEST_COMM_MEM");
        on = e && !strcmp(e, "1");
    }
    return on;
}

/* With --all-algos, communication memory given back is kept for the next
 * case (zeroed again, as fresh memory is): fresh pages cost 15 us each on
 * a virtual machine that shadows the page tables (see main), and that run
 * is about the algorithms. The plain matrix frees and allocates each
 * case's buffers, so peers meet freed regions and new ones at old
 * addresses. A case holds at most a few buffers at once; each slot is one
 * buffer, held or kept. */
static int reuse_mem;
enum { SLOTS = 8 };
static struct {
    void *p;
    size_t n;
    int held;
} slots[SLOTS];

static void *alloc_bytes(size_t n)
{
    if (!comm_mem()) return calloc(n ? n : 1, 1);
    if (!reuse_mem) return dt_comm_mem_alloc(n);
    int empty = -1;
    for (int i = 0; i < SLOTS; i++) {
        if (slots[i].p && !slots[i].held && slots[i].n >= n) {
            slots[i].held = 1;
            memset(slots[i].p, 0, n);
            return slots[i].p;
        }
        if (!slots[i].p && empty < 0) empty = i;
    }
    void *p = dt_comm_mem_alloc(n);
    if (p && empty >= 0) slots[empty].p = p, slots[empty].n = n, slots[empty].held = 1;
    return p;
}

static void free_bytes(void *p)
{
    if (!comm_mem()) {
        free(p);
        return;
    }
    for (int i = 0; i < SLOTS; i++)
        if (p && slots[i].p == p) {
            slots[i].held = 0;
            return;
        }
    dt_comm_mem_free(p);
}

/* ---- one test per collective ------------------------------------------------ */

static void test_allreduce(dt_comm *c, caseinfo k)
{
    size_t esz = dt_dtype_size(k.t);
    char *in = alloc_bytes(k.count * esz), *out = alloc_bytes(k.count * esz);
    for (size_t i = 0; i < k.count; i++) put(k.t, in, i, input(rank, i, k.t, k.op, 1));
    if (k.inplace) memcpy(out, in, k.count * esz);
    must(c, dt_allreduce(c, k.inplace ? out : in, out, k.count, k.t, k.op), "dt_allreduce");
    for (size_t i = 0; i < k.count; i++) check_elem(&k, i, get(k.t, out, i), reference(i, k.t, k.op, 1));
    free_bytes(in);
    free_bytes(out);
}

static void test_reduce(dt_comm *c, caseinfo k)
{
    size_t esz = dt_dtype_size(k.t);
    char *in = alloc_bytes(k.count * esz), *out = alloc_bytes(k.count * esz);
    for (size_t i = 0; i < k.count; i++) put(k.t, in, i, input(rank, i, k.t, k.op, 2));
    if (k.inplace) memcpy(out, in, k.count * esz);
    must(c, dt_reduce(c, k.inplace ? out : in, out, k.count, k.t, k.op, k.root), "dt_reduce");
    if (rank == k.root)
        for (size_t i = 0; i < k.count; i++)
            check_elem(&k, i, get(k.t, out, i), reference(i, k.t, k.op, 2));
    for (size_t i = 0; i < k.count && !k.inplace; i++) /* send is never written */
        check_elem(&k, i, get(k.t, in, i), input(rank, i, k.t, k.op, 2));
    free_bytes(in);
    free_bytes(out);
}

static void test_reduce_scatter(dt_comm *c, caseinfo k)
{
    size_t esz = dt_dtype_size(k.t), n = k.count * (size_t)size;
    char *in = alloc_bytes(n * esz), *out = alloc_bytes(n * esz);
    for (size_t i = 0; i < n; i++) put(k.t, in, i, input(rank, i, k.t, k.op, 3));
    if (k.inplace) memcpy(out, in, n * esz);
    must(c, dt_reduce_scatter(c, k.inplace ? out : in, out, k.count, k.t, k.op),
         "dt_reduce_scatter");
    for (size_t i = 0; i < k.count; i++)
        check_elem(&k, i, get(k.t, out, i), reference((size_t)rank * k.count + i, k.t, k.op, 3));
    if (k.inplace) { /* NCCL's in-place layout: the result lands in our own block */
        char *own = out + (size_t)rank * k.count * esz;
        memcpy(out, in, n * esz);
        must(c, dt_reduce_scatter(c, out, own, k.count, k.t, k.op), "dt_reduce_scatter (NCCL in place)");
        for (size_t i = 0; i < k.count; i++)
            check_elem(&k, i, get(k.t, own, i), reference((size_t)rank * k.count + i, k.t, k.op, 3));
    }
    free_bytes(in);
    free_bytes(out);
}

static void test_broadcast(dt_comm *c, caseinfo k)
{
    size_t esz = dt_dtype_size(k.t);
    char *in = alloc_bytes(k.count * esz), *out = alloc_bytes(k.count * esz);
    for (size_t i = 0; i < k.count; i++) put(k.t, in, i, input(k.root, i, k.t, DT_SUM, 4));
    if (k.inplace && rank == k.root) memcpy(out, in, k.count * esz);
    must(c, dt_broadcast(c, k.inplace ? out : in, out, k.count, k.t, k.root), "dt_broadcast");
    for (size_t i = 0; i < k.count; i++)
        check_elem(&k, i, get(k.t, out, i), input(k.root, i, k.t, DT_SUM, 4));
    free_bytes(in);
    free_bytes(out);
}

static void test_gather(dt_comm *c, caseinfo k)
{
    size_t esz = dt_dtype_size(k.t), n = k.count * (size_t)size;
    char *in = alloc_bytes(k.count * esz), *out = alloc_bytes(n * esz);
    for (size_t i = 0; i < k.count; i++) put(k.t, in, i, input(rank, i, k.t, DT_SUM, 5));
    const void *send = in;
    if (k.inplace) { /* own block already in its slot (root), or send == recv elsewhere */
        if (rank == k.root) {
            memcpy(out + (size_t)rank * k.count * esz, in, k.count * esz);
        } else {
            memcpy(out, in, k.count * esz);
        }
        send = out;
    }
    must(c, dt_gather(c, send, out, k.count, k.t, k.root), "dt_gather");
    if (rank == k.root)
        for (size_t i = 0; i < n; i++)
            check_elem(&k, i, get(k.t, out, i), input((int)(i / k.count), i % k.count, k.t, DT_SUM, 5));
    free_bytes(in);
    free_bytes(out);
}

static void test_scatter(dt_comm *c, caseinfo k)
{
    size_t esz = dt_dtype_size(k.t), n = k.count * (size_t)size;
    char *in = alloc_bytes(n * esz), *out = alloc_bytes(n * esz);
    for (size_t i = 0; i < n; i++) put(k.t, in, i, input(k.root, i, k.t, DT_SUM, 6));
    /* In place at the root: its block stays where it is in send. */
    int inplace_root = k.inplace && rank == k.root;
    if (inplace_root) memcpy(out, in, n * esz);
    must(c, dt_scatter(c, inplace_root ? out : in, out, k.count, k.t, k.root), "dt_scatter");
    size_t base = inplace_root ? (size_t)rank * k.count : 0;
    for (size_t i = 0; i < k.count; i++)
        check_elem(&k, i, get(k.t, out, base + i),
                   input(k.root, (size_t)rank * k.count + i, k.t, DT_SUM, 6));
    free_bytes(in);
    free_bytes(out);
}

static void test_allgather(dt_comm *c, caseinfo k)
{
    size_t esz = dt_dtype_size(k.t), n = k.count * (size_t)size;
    char *in = alloc_bytes(k.count * esz), *out = alloc_bytes(n * esz);
    for (size_t i = 0; i < k.count; i++) put(k.t, in, i, input(rank, i, k.t, DT_SUM, 7));
    if (k.inplace) memcpy(out + (size_t)rank * k.count * esz, in, k.count * esz);
    must(c, dt_allgather(c, k.inplace ? out : in, out, k.count, k.t), "dt_allgather");
    for (size_t i = 0; i < n; i++)
        check_elem(&k, i, get(k.t, out, i), input((int)(i / k.count), i % k.count, k.t, DT_SUM, 7));
    if (k.inplace) { /* NCCL's in-place layout: send is our slot of recv */
        memset(out, 0xee, n * esz);
        memcpy(out + (size_t)rank * k.count * esz, in, k.count * esz);
        must(c, dt_allgather(c, out + (size_t)rank * k.count * esz, out, k.count, k.t),
             "dt_allgather (NCCL in place)");
        for (size_t i = 0; i < n; i++)
            check_elem(&k, i, get(k.t, out, i), input((int)(i / k.count), i % k.count, k.t, DT_SUM, 7));
    }
    free_bytes(in);
    free_bytes(out);
}

static void test_alltoall(dt_comm *c, caseinfo k)
{
    size_t esz = dt_dtype_size(k.t), n = k.count * (size_t)size;
    char *in = alloc_bytes(n * esz), *out = alloc_bytes(n * esz);
    /* Block j of rank r's input is meant for rank j. */
    for (size_t i = 0; i < n; i++) put(k.t, in, i, input(rank, i, k.t, DT_SUM, 8));
    if (k.inplace) memcpy(out, in, n * esz);
    must(c, dt_alltoall(c, k.inplace ? out : in, out, k.count, k.t), "dt_alltoall");
    for (size_t i = 0; i < n; i++) {
        int from = (int)(i / k.count);
        size_t j = (size_t)rank * k.count + i % k.count;
        check_elem(&k, i, get(k.t, out, i), input(from, j, k.t, DT_SUM, 8));
    }
    free_bytes(in);
    free_bytes(out);
}

/* ---- the matrix ---------------------------------------------------------------- */

/* ops_on_two: the ops past sum and avg only on f32 and i32. An algorithm
 * hands the op to the reduction kernels, so an op bug in an algorithm (an
 * accumulator started at zero, say) shows in any dtype, and a dtype bug
 * (an element size) in any op; --all-algos runs the matrix once per
 * algorithm, and the full op x dtype matrix runs without it. */
static void run_matrix(dt_comm *c, size_t large, int quick, int ops_on_two)
{
    size_t counts[6] = {0, 1, (size_t)(size > 1 ? size - 1 : 2), (size_t)size,
                        (size_t)size + 1, large};
    int roots[3] = {0, size - 1, size / 2}, nroots = size == 1 ? 1 : size == 2 ? 2 : 3;
    for (int t = 0; t < DT_DTYPE_COUNT; t++)
        for (int ci = 0; ci < 6; ci++)
            for (int inplace = 0; inplace < 2; inplace++) {
                size_t n = counts[ci];
                /* The large count for every dtype and op would be slow with
                 * more ranks than cores; f32 and one other dtype suffice. */
                int big = ci == 5, full_ops = !big || t == DT_F32 || t == DT_BF16;
                if (quick && big && t != DT_F32) continue;
                if (ops_on_two && !big && t != DT_F32 && t != DT_I32) full_ops = 0;
                for (int op = 0; op < DT_OP_COUNT; op++) {
                    if (!full_ops && op != DT_SUM && !(op == DT_AVG && !big)) continue;
                    if (op >= DT_BAND && !is_integer((dt_dtype)t)) continue; /* refused */
                    caseinfo k = {"allreduce", (dt_dtype)t, (dt_op)op, n, 0, inplace};
                    test_allreduce(c, k);
                    k.coll = "reduce_scatter";
                    test_reduce_scatter(c, k);
                    k.coll = "reduce";
                    for (int ri = 0; ri < nroots; ri++) {
                        k.root = roots[ri];
                        if (!big || ri == 0) test_reduce(c, k);
                    }
                }
                for (int ri = 0; ri < nroots; ri++) {
                    caseinfo k = {"broadcast", (dt_dtype)t, DT_SUM, n, roots[ri], inplace};
                    if (big && ri > 0) continue;
                    test_broadcast(c, k);
                    k.coll = "gather";
                    test_gather(c, k);
                    k.coll = "scatter";
                    test_scatter(c, k);
                }
                caseinfo k = {"allgather", (dt_dtype)t, DT_SUM, n, 0, inplace};
                test_allgather(c, k);
                k.coll = "alltoall";
                test_alltoall(c, k);
            }
}

/* Random floats: sums are inexact, so check the tolerance against the serial
 * sum and that every rank holds exactly the same bits. */
static void test_bit_identical(dt_comm *c, size_t n)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)(mix(rank * 7777u + i) >> 11) / 9007199254740992.0 - 0.5);
    must(c, dt_allreduce(c, x, x, n, DT_F32, DT_SUM), "dt_allreduce (random)");
    uint64_t h = dt_fnv1a64(x, n * sizeof *x);
    uint64_t *all = malloc((size_t)size * sizeof *all);
    must(c, dt_allgather(c, &h, all, 1, DT_I64), "dt_allgather (hashes)");
    for (int r = 0; r < size; r++)
        CHECK(all[r] == h, "random allreduce: rank %d's result differs from ours", r);
    for (size_t i = 0; i < n; i += 97) {
        double want = 0;
        for (int r = 0; r < size; r++) want += (double)(float)((double)(mix(r * 7777u + i) >> 11) / 9007199254740992.0 - 0.5);
        CHECK(fabs(x[i] - want) <= 1e-5 * size, "random allreduce: element %zu is %g, expected %g",
              i, x[i], want);
    }
    free(all);
    free(x);
}

static void test_split(dt_comm *c)
{
    /* Even and odd ranks, ordered by descending old rank. */
    dt_comm *sub = NULL;
    must(c, dt_comm_split(c, rank % 2, -rank, &sub), "dt_comm_split");
    int members = (size + 1 - rank % 2) / 2;
    CHECK(sub && dt_comm_size(sub) == members, "split: size %d, expected %d",
          sub ? dt_comm_size(sub) : -1, members);
    if (!sub || dt_comm_size(sub) != members) return;
    int want_rank = 0;
    for (int r = rank + 2; r < size; r += 2) want_rank++;
    CHECK(dt_comm_rank(sub) == want_rank, "split: rank %d, expected %d", dt_comm_rank(sub),
          want_rank);
    int64_t v = rank, sum = 0;
    must(sub, dt_allreduce(sub, &v, &sum, 1, DT_I64, DT_SUM), "dt_allreduce on split");
    int64_t want = 0;
    for (int r = rank % 2; r < size; r += 2) want += r;
    CHECK(sum == want, "split allreduce: %lld, expected %lld", (long long)sum, (long long)want);
    /* A nested split, and ranks opting out with DT_UNDEFINED. */
    dt_comm *inner = NULL;
    must(sub, dt_comm_split(sub, dt_comm_rank(sub) == 0 ? DT_UNDEFINED : 0, 0, &inner), "nested split");
    CHECK((dt_comm_rank(sub) == 0) == (inner == NULL), "nested split: DT_UNDEFINED not honoured");
    if (inner) {
        must(inner, dt_barrier(inner), "barrier on nested split");
        dt_comm_destroy(inner);
    }
    dt_comm_destroy(sub);
    must(c, dt_barrier(c), "dt_barrier after split");
}

static void test_nonblocking(dt_comm *c)
{
    enum { K = 6, N = 1000 };
    float bufs[K][N];
    dt_request *req[K];
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < N; i++) bufs[k][i] = (float)(rank + k + i % 5);
        must(c, dt_iallreduce(c, bufs[k], bufs[k], N, DT_F32, DT_SUM, &req[k]), "dt_iallreduce");
    }
    for (int k = K - 1; k >= 0; k--) must(c, dt_wait(req[k]), "dt_wait");
    for (int k = 0; k < K; k++)
        for (int i = 0; i < N; i++) {
            float want = 0;
            for (int r = 0; r < size; r++) want += (float)(r + k + i % 5);
            CHECK(bufs[k][i] == want, "iallreduce %d element %d is %g, expected %g", k, i,
                  bufs[k][i], want);
            if (bufs[k][i] != want) break;
        }
    /* A blocking call queues behind pending ones and keeps the order. */
    int32_t a = rank, b = 0;
    dt_request *r1;
    must(c, dt_ibroadcast(c, &a, &a, 1, DT_I32, 0, &r1), "dt_ibroadcast");
    must(c, dt_allreduce(c, &a, &b, 1, DT_I32, DT_SUM), "dt_allreduce after ibroadcast");
    must(c, dt_wait(r1), "dt_wait");
    CHECK(b == 0 && a == 0, "ibroadcast then allreduce gave a=%d b=%d", a, b);
}

static void test_p2p(dt_comm *c)
{
    if (size < 2) return;
    enum { N = 70000 }; /* over the CMA threshold in bytes */
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    double *out = malloc(N * sizeof *out), *in = malloc(N * sizeof *in);
    for (int i = 0; i < N; i++) out[i] = rank * 1e6 + i;
    for (int round = 0; round < 3; round++) {
        if (rank % 2 == 0) {
            must(c, dt_send(c, out, N, DT_F64, right), "dt_send");
            must(c, dt_recv(c, in, N, DT_F64, left), "dt_recv");
        } else {
            must(c, dt_recv(c, in, N, DT_F64, left), "dt_recv");
            must(c, dt_send(c, out, N, DT_F64, right), "dt_send");
        }
        for (int i = 0; i < N; i += 101) {
            CHECK(in[i] == left * 1e6 + i, "p2p round %d: element %d is %g", round, i, in[i]);
            if (in[i] != left * 1e6 + i) break;
        }
    }
    /* Everyone isends before it irecvs: only works if queued sends and
     * receives progress together (large messages wait for the receiver). */
    dt_request *rs, *rr;
    memset(in, 0, N * sizeof *in);
    must(c, dt_isend(c, out, N, DT_F64, right, &rs), "dt_isend");
    must(c, dt_irecv(c, in, N, DT_F64, left, &rr), "dt_irecv");
    must(c, dt_wait(rr), "dt_wait(irecv)");
    must(c, dt_wait(rs), "dt_wait(isend)");
    for (int i = 0; i < N; i += 101) {
        CHECK(in[i] == left * 1e6 + i, "isend/irecv exchange: element %d is %g", i, in[i]);
        if (in[i] != left * 1e6 + i) break;
    }
    free(out);
    free(in);
}

static const char *choosable[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                  "alltoall"};
#define NCHOOSABLE 5

/* The algorithms of coll under test (MPI's only with_mpi). */
static int algos_of(const char *coll, int with_mpi, const char **out)
{
    const char *names[32];
    int n = dt_comm_algo_names(coll, names, 32), k = 0;
    for (int i = 0; i < n && i < 32; i++)
        if (with_mpi || strcmp(names[i], "mpi")) out[k++] = names[i];
    return k;
}

/* Force algorithm `pass` (wrapping) of every collective; returns 0 once
 * every algorithm has had its pass. */
static int force_pass(dt_comm *c, int pass, int with_mpi)
{
    int more = 0;
    size_t o = 0;
    for (int i = 0; i < NCHOOSABLE; i++) {
        const char *names[32];
        int n = algos_of(choosable[i], with_mpi, names);
        if (pass < n) more = 1;
        const char *name = names[pass % n];
        must(c, dt_comm_set_algo(c, choosable[i], name), "dt_comm_set_algo");
        o += (size_t)snprintf(algo_label + o, sizeof algo_label - o, "%s=%s ", choosable[i], name);
    }
    snprintf(algo_label + o, sizeof algo_label - o, "| ");
    check_set_label("rank %d: %s", rank, algo_label);
    return more;
}

/* A bitwise op on floating values has no meaning: refused on every rank
 * alike, naming the op and the dtypes that take it, before anything moves. */
static void test_bitwise_refused(dt_comm *c)
{
    float x[4] = {1, 2, 3, 4};
    int rc = dt_allreduce(c, x, x, 4, DT_F32, DT_BXOR);
    CHECK(rc == DT_ERR_INVALID && strstr(dt_comm_error(c), "op bxor needs an integer dtype"),
          "allreduce bxor on f32: rc %d, '%s'", rc, dt_comm_error(c));
    rc = dt_allreduce(c, x, x, 4, DT_F32, DT_SUM); /* the communicator goes on */
    CHECK(rc == 0 && x[0] == (float)size, "allreduce after the refusal: rc %d, %g", rc, x[0]);
}

int main(int argc, char **argv)
{
    /* Every case allocates its buffers afresh; glibc would map the large
     * ones anew each time and unmap them after, and each first touch of
     * a fresh page costs 15 us on a virtual machine that shadows the page
     * tables (the 8-rank matrix spent half its time there). Kept in the
     * heap, the pages are reused. */
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    size_t large = 262147;
    int quick = 0, all_algos = 0, with_mpi = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--large") && i + 1 < argc)
            large = (size_t)strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--all-algos"))
            all_algos = reuse_mem = 1;
        else if (!strcmp(argv[i], "--mpi"))
            with_mpi = 1;
        else {
            fprintf(stderr, "usage: %s [--large N] [--quick] [--all-algos [--mpi]]\n", argv[0]);
            return 2;
        }
    }
    dt_comm *c;
    if (dt_comm_init(&c) != 0) {
        fprintf(stderr, "dt_comm_init: %s\n", dt_last_error());
        return 1;
    }
    rank = dt_comm_rank(c);
    size = dt_comm_size(c);
    check_set_label("rank %d: ", rank);
    int passes = 0;
    for (int pass = 0; all_algos ? force_pass(c, pass, with_mpi) : pass == 0; pass++, passes++) {
        run_matrix(c, large, quick, all_algos);
        test_bit_identical(c, large + 13);
    }
    if (all_algos) {
        algo_label[0] = '\0';
        check_set_label("rank %d: ", rank);
        for (int i = 0; i < NCHOOSABLE; i++) must(c, dt_comm_set_algo(c, choosable[i], "auto"), "auto");
        if (rank == 0) printf("test_collectives: %d passes, each algorithm of every collective forced\n", passes);
    }
    test_bitwise_refused(c);
    test_split(c);
    test_nonblocking(c);
    test_p2p(c);
    if (rank == 0)
        printf("test_collectives: %d ranks over %s: %ld checks, %d failed on rank 0\n", size,
               dt_comm_transport(c), checks, failures);
    dt_comm_destroy(c);
    return failures ? 1 : 0;
}
