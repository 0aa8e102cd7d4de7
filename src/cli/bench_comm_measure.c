/*
 * Measuring one point of `dtrain bench comm`: inputs that are small
 * integers (so every sum is exact in the dtype and every wrong element is
 * counted), a check on fresh inputs, then the timed calls (OSU's way:
 * warm-up first, many iterations for small messages, fewer for large).
 * The time reported is the slowest rank's average.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_comm.h"
#include "comm/cost/model.h"
#include "comm/reduce_ops.h"
#include "core/timer.h"

const char *const bench_op_names[B_NOPS] = {"allreduce", "allgather", "reduce_scatter",
                                            "broadcast", "alltoall", "alltoallv"};

static int per_rank_op(bench_op op)
{
    return op == B_ALLGATHER || op == B_REDUCE_SCATTER || op == B_ALLTOALL;
}

int bench_has_inplace(bench_op op) { return op != B_ALLTOALLV; }

/* The all-to-all-v's pattern, uneven as a mixture of experts' dispatch
 * is: rank i sends rank j count x (1 + (j - i) mod p) elements, so a
 * rank's blocks weigh 1 (its own) to p; blocks are packed in rank order
 * on both sides, and every rank sends and receives count x p(p+1)/2. */
static size_t v_weight(int from, int to, int p) { return 1 + (size_t)(((to - from) % p + p) % p); }

static size_t v_units(int p) { return (size_t)p * (size_t)(p + 1) / 2; }

/* Where rank from's block for rank to starts in its send buffer. */
static size_t v_send_displ(size_t count, int from, int to, int p)
{
    size_t units = 0;
    for (int k = 0; k < to; k++) units += v_weight(from, k, p);
    return count * units;
}

/* This rank's counts and displacements for weight `count` into b->v. */
static void v_layout(bench_ctx *b, size_t count)
{
    size_t p = (size_t)b->size, *sc = b->v, *sd = sc + p, *rc = sd + p, *rd = rc + p;
    size_t so = 0, ro = 0;
    for (int j = 0; j < b->size; j++) {
        sc[j] = count * v_weight(b->rank, j, b->size);
        rc[j] = count * v_weight(j, b->rank, b->size);
        sd[j] = so;
        rd[j] = ro;
        so += sc[j];
        ro += rc[j];
    }
}

size_t bench_algo_count(const bench_ctx *b, bench_op op, const bench_size *s)
{
    return op == B_ALLTOALLV ? s->count * (size_t)b->size : s->count;
}

/* nccl-tests: busbw = algbw x this. */
double bench_bus_factor(bench_op op, int p)
{
    double n = p;
    switch (op) {
    case B_ALLREDUCE: return 2 * (n - 1) / n;
    case B_BROADCAST: return 1;
    default: return (n - 1) / n;
    }
}

int bench_sizes(const bench_ctx *b, bench_op op, bench_size **out)
{
    const bench_opts *o = b->o;
    int cap = 16, n = 0;
    bench_size *v = malloc((size_t)cap * sizeof *v);
    for (double s = (double)o->min_bytes; v && s <= (double)o->max_bytes; s *= o->factor) {
        size_t unit = b->esz * (op == B_ALLTOALLV ? v_units(b->size)
                                : per_rank_op(op)   ? (size_t)b->size
                                                    : 1);
        size_t count = (size_t)s / unit;
        if (count == 0) count = 1;
        size_t bytes = count * unit;
        if (n == 0 || bytes != v[n - 1].bytes) {
            if (n == cap) {
                bench_size *w = realloc(v, (size_t)(cap *= 2) * sizeof *v);
                if (!w) break;
                v = w;
            }
            v[n++] = (bench_size){count, bytes};
        }
        if (s == 0) s = 1.0 / o->factor; /* --min-bytes 0: go on from 1 */
    }
    *out = v;
    return v ? n : 0;
}

int bench_iters_for(const bench_opts *o, size_t bytes)
{
    if (o->iters) return o->iters;
    if (bytes <= (64u << 10)) return 1000;
    if (bytes <= (4u << 20)) return 100;
    return 20;
}

/* The largest input value such that p of them sum exactly in the dtype
 * (at most 6: inputs are (i % 5 + rank % 3), folded into 0..vmax). */
static int vmax_for(dt_dtype t, int p)
{
    double limit;
    switch (t) {
    case DT_BF16: limit = 256; break;
    case DT_F16: limit = 2048; break;
    case DT_U8: limit = 254; break; /* and never 255, the poison */
    case DT_F32: limit = 16777216.0; break;
    default: limit = 2147483647.0; break;
    }
    double v = floor(limit / p);
    return v > 6 ? 6 : (int)v;
}

static double value_of(int vmax, int rank, size_t i)
{
    return (double)(((int)(i % 5) + rank % 3) % (vmax + 1));
}

static void put(dt_dtype t, void *dst, size_t i, double v)
{
    switch (t) {
    case DT_F32: ((float *)dst)[i] = (float)v; break;
    case DT_F64: ((double *)dst)[i] = v; break;
    case DT_BF16: ((uint16_t *)dst)[i] = dt_f32_to_bf16((float)v); break;
    case DT_F16: ((uint16_t *)dst)[i] = dt_f32_to_f16((float)v); break;
    case DT_I32: ((int32_t *)dst)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)dst)[i] = (int64_t)v; break;
    case DT_U8: ((uint8_t *)dst)[i] = (uint8_t)v; break;
    default: break;
    }
}

static double get(dt_dtype t, const void *p, size_t i)
{
    switch (t) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F64: return ((const double *)p)[i];
    case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)p)[i]);
    case DT_F16: return dt_f16_to_f32(((const uint16_t *)p)[i]);
    case DT_I32: return ((const int32_t *)p)[i];
    case DT_I64: return (double)((const int64_t *)p)[i];
    case DT_U8: return ((const uint8_t *)p)[i];
    default: return 0;
    }
}

/* Elements of the send and receive sides of a call of count (per rank). */
static void extents(const bench_ctx *b, bench_op op, size_t count, size_t *ns, size_t *nr)
{
    size_t p = (size_t)b->size;
    *ns = op == B_REDUCE_SCATTER || op == B_ALLTOALL ? count * p : count;
    *nr = op == B_ALLGATHER || op == B_ALLTOALL ? count * p : count;
    if (op == B_ALLTOALLV) *ns = *nr = count * v_units(b->size);
}

/* Poison what the call will write (0xff: NaN, -1 or 255, never expected),
 * then write this rank's inputs where the call reads them. */
static void prepare(bench_ctx *b, bench_op op, size_t count, int inplace)
{
    size_t ns, nr;
    extents(b, op, count, &ns, &nr);
    memset(b->recv, 0xff, (ns > nr ? ns : nr) * b->esz);
    char *dst = inplace ? b->recv : b->send;
    size_t first = 0;
    if (inplace && op == B_ALLGATHER) first = (size_t)b->rank * count; /* our slot */
    if (inplace && op == B_BROADCAST && b->rank != 0) return; /* only the root's data counts */
    if (op == B_ALLTOALLV) v_layout(b, count);
    int vmax = vmax_for(b->o->dtype, b->size);
    for (size_t i = 0; i < ns; i++) put(b->o->dtype, dst, first + i, value_of(vmax, b->rank, i));
}

static int run_op(bench_ctx *b, bench_op op, size_t count, int inplace)
{
    char *s = inplace ? b->recv : b->send;
    dt_dtype t = b->o->dtype;
    switch (op) {
    case B_ALLREDUCE: return dt_allreduce(b->c, s, b->recv, count, t, DT_SUM);
    case B_ALLGATHER:
        return dt_allgather(b->c, inplace ? b->recv + (size_t)b->rank * count * b->esz : s,
                            b->recv, count, t);
    case B_REDUCE_SCATTER: return dt_reduce_scatter(b->c, s, b->recv, count, t, DT_SUM);
    case B_BROADCAST: return dt_broadcast(b->c, s, b->recv, count, t, 0);
    case B_ALLTOALL: return dt_alltoall(b->c, s, b->recv, count, t);
    case B_ALLTOALLV: {
        size_t p = (size_t)b->size;
        return dt_alltoallv(b->c, s, b->v, b->v + p, b->recv, b->v + 2 * p, b->v + 3 * p, t);
    }
    default: return DT_ERR_INVALID;
    }
}

/* The all-to-all-v's blocks against what each peer's pattern sent. */
static long count_wrong_v(const bench_ctx *b, size_t count)
{
    int p = b->size, vmax = vmax_for(b->o->dtype, p);
    const size_t *rc = b->v + 2 * (size_t)p, *rd = rc + p;
    long wrong = 0;
    for (int i = 0; i < p; i++) {
        size_t from = v_send_displ(count, i, b->rank, p);
        for (size_t e = 0; e < rc[i]; e++)
            wrong += get(b->o->dtype, b->recv, rd[i] + e) != value_of(vmax, i, from + e);
    }
    return wrong;
}

/* Elements of recv that differ from the exact expected result. */
static long count_wrong(const bench_ctx *b, bench_op op, size_t count)
{
    if (op == B_ALLTOALLV) return count_wrong_v(b, count);
    long wrong = 0;
    int p = b->size, vmax = vmax_for(b->o->dtype, p);
    size_t ns, nr;
    extents(b, op, count, &ns, &nr);
    for (size_t i = 0; i < nr; i++) {
        double want = 0;
        switch (op) {
        case B_ALLREDUCE:
            for (int r = 0; r < p; r++) want += value_of(vmax, r, i);
            break;
        case B_REDUCE_SCATTER:
            for (int r = 0; r < p; r++) want += value_of(vmax, r, (size_t)b->rank * count + i);
            break;
        case B_ALLGATHER: want = value_of(vmax, (int)(i / count), i % count); break;
        case B_BROADCAST: want = value_of(vmax, 0, i); break;
        case B_ALLTOALL:
            want = value_of(vmax, (int)(i / count), (size_t)b->rank * count + i % count);
            break;
        default: break;
        }
        wrong += get(b->o->dtype, b->recv, i) != want;
    }
    return wrong;
}

int bench_measure(bench_ctx *b, bench_op op, const bench_size *s, int inplace, bench_point *pt)
{
    size_t count = s->count;
    int iters = bench_iters_for(b->o, s->bytes);
    /* OSU's rule: warm up in proportion, so caches, page tables and the
     * branch predictors are hot before a small message is timed. */
    int warmup = b->o->warmup >= 0 ? b->o->warmup : iters / 10 > 5 ? iters / 10 : 5;
    int rc = 0;
    for (int i = 0; i < warmup && rc == 0; i++) {
        prepare(b, op, count, inplace);
        rc = run_op(b, op, count, inplace);
    }
    prepare(b, op, count, inplace);
    if (rc == 0) rc = run_op(b, op, count, inplace);
    long w = rc == 0 ? count_wrong(b, op, count) : 0;
    if (rc == 0) rc = dt_barrier(b->c);
    /* Timed calls reuse the inputs (in place they compound, as in
     * nccl-tests); the check above ran on fresh inputs. */
    uint64_t t0 = dt_now_ns();
    for (int i = 0; i < iters && rc == 0; i++) rc = run_op(b, op, count, inplace);
    double t = (double)(dt_now_ns() - t0) / 1e3 / iters;
    double mx[2] = {t, -t}, mx_all[2] = {0, 0}, sum[2] = {t, (double)w}, sum_all[2] = {0, 0};
    if (rc == 0) rc = dt_allreduce(b->c, mx, mx_all, 2, DT_F64, DT_MAX);
    if (rc == 0) rc = dt_allreduce(b->c, sum, sum_all, 2, DT_F64, DT_SUM);
    *pt = (bench_point){mx_all[0], -mx_all[1], sum_all[0] / b->size, (long)sum_all[1], iters};
    return rc;
}

/* Rank 0's copy alone, then every rank's at once: the ranks of a host
 * share its memory, so a collective that moves data on all of them at
 * once gets the second, whatever its algorithm. */
int bench_copy_bandwidth(bench_ctx *b, double *gbps, size_t *bytes)
{
    const size_t n = 32u << 20;
    *gbps = 0;
    *bytes = n;
    int rc = dt_barrier(b->c);
    if (rc == 0 && b->rank == 0) {
        double s = dt_measure_copy(n);
        *gbps = s > 0 ? 1e-9 / s : 0;
    }
    if (rc == 0) rc = dt_barrier(b->c);
    double mine = 0, slowest = 0;
    if (rc == 0) {
        double s = dt_measure_copy(n);
        mine = s > 0 ? 1e-9 / s : 0;
        rc = dt_allreduce(b->c, &mine, &slowest, 1, DT_F64, DT_MIN);
    }
    b->copy_all_gbps = slowest;
    return rc;
}
