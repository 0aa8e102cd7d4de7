/*
 * `dtrain bench comm`: the nccl-tests of dtrain. For each message size it
 * times a collective out of place and in place and prints the nccl-tests
 * table (time, algorithm bandwidth, bus bandwidth, #wrong). Inputs are
 * small integers so the expected result is exact and every wrong element
 * is counted. Run it under `dtrain launch`, mpirun or srun, or give
 * --nproc N to have it start its own ranks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "comm/reduce_ops.h"
#include "core/timer.h"
#include "dtrain/comm.h"

typedef enum { B_ALLREDUCE, B_ALLGATHER, B_REDUCE_SCATTER, B_BROADCAST, B_ALLTOALL } bench_op;

static const char *op_names[] = {"allreduce", "allgather", "reduce_scatter", "broadcast",
                                 "alltoall"};

typedef struct {
    bench_op op;
    size_t min_bytes, max_bytes;
    double factor;
    dt_dtype dtype;
    int iters, warmup;
    int nproc;
} bench_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain bench comm [--nproc N] [--op OP] [--min-bytes B] [--max-bytes B]\n"
            "                         [--step-factor F] [--dtype T] [--iters N] [--warmup N]\n"
            "\n"
            "  --op OP          allreduce (default), allgather, reduce_scatter, broadcast, alltoall\n"
            "  --min-bytes B    smallest message (default 8; K, M, G suffixes)\n"
            "  --max-bytes B    largest message (default 64M)\n"
            "  --step-factor F  size multiplier between rows (default 4)\n"
            "  --dtype T        f32 (default), f64, bf16, f16, i32, i64, u8\n"
            "  --iters N        timed iterations per size (default: 1000 small, fewer large)\n"
            "  --warmup N       untimed iterations first (default 5)\n"
            "  --nproc N        start N local ranks (otherwise run under a launcher)\n"
            "\n"
            "example: dtrain bench comm --nproc 2 --op allreduce --max-bytes 256M\n");
}

static int parse_bytes(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    double mult = 1;
    if (*end == 'K' || *end == 'k') mult = 1024, end++;
    else if (*end == 'M' || *end == 'm') mult = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mult = 1024.0 * 1024 * 1024, end++;
    if (*end || v < 0 || end == s) return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_dtype(const char *s, dt_dtype *out)
{
    for (int t = 0; t < DT_DTYPE_COUNT; t++)
        if (!strcmp(s, dt_dtype_name((dt_dtype)t))) {
            *out = (dt_dtype)t;
            return 0;
        }
    return -1;
}

static int bad(const char *flag, const char *val)
{
    fprintf(stderr, "dtrain bench comm: invalid value '%s' for %s\n", val ? val : "", flag);
    return CLI_EXIT_USAGE;
}

static int parse_opts(int argc, char **argv, bench_opts *o)
{
    *o = (bench_opts){B_ALLREDUCE, 8, 64u << 20, 4, DT_F32, 0, 5, 0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout);
            exit(0);
        }
        int known = 1, ok = v != NULL;
        if (!strcmp(f, "--op")) {
            ok = 0;
            for (int k = 0; v && k < 5; k++)
                if (!strcmp(v, op_names[k])) o->op = (bench_op)k, ok = 1;
        } else if (!strcmp(f, "--min-bytes")) ok = ok && parse_bytes(v, &o->min_bytes) == 0;
        else if (!strcmp(f, "--max-bytes")) ok = ok && parse_bytes(v, &o->max_bytes) == 0;
        else if (!strcmp(f, "--step-factor")) ok = ok && (o->factor = atof(v)) > 1;
        else if (!strcmp(f, "--dtype")) ok = ok && parse_dtype(v, &o->dtype) == 0;
        else if (!strcmp(f, "--iters")) ok = ok && (o->iters = atoi(v)) > 0;
        else if (!strcmp(f, "--warmup")) ok = ok && (o->warmup = atoi(v)) >= 0;
        else if (!strcmp(f, "--nproc")) ok = ok && (o->nproc = atoi(v)) > 0;
        else known = 0;
        if (!known) {
            fprintf(stderr, "dtrain bench comm: unknown option '%s'\n", f);
            usage(stderr);
            return CLI_EXIT_USAGE;
        }
        if (!ok) return bad(f, v);
        i++;
    }
    if (o->min_bytes > o->max_bytes) return bad("--min-bytes", "larger than --max-bytes");
    return 0;
}

/* Re-run ourselves under `dtrain launch -n N`, minus the --nproc flag. */
static int relaunch(int argc, char **argv, int nproc)
{
    char n[16];
    snprintf(n, sizeof n, "%d", nproc);
    char **args = calloc((size_t)argc + 8, sizeof *args);
    int k = 0;
    args[k++] = "dtrain";
    args[k++] = "launch";
    args[k++] = "-n";
    args[k++] = n;
    args[k++] = "--";
    args[k++] = "/proc/self/exe";
    args[k++] = "bench";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc")) {
            i++;
            continue;
        }
        args[k++] = argv[i];
    }
    execv("/proc/self/exe", args);
    perror("dtrain bench comm: re-running under dtrain launch");
    return 1;
}

/* ---- one measurement ----------------------------------------------------------- */

typedef struct {
    dt_comm *c;
    const bench_opts *o;
    int rank, size;
    size_t esz;
    char *send, *recv;
} bench_ctx;

static size_t elems_in(const bench_ctx *b, size_t bytes)
{
    size_t n = bytes / b->esz;
    if (b->o->op == B_ALLGATHER || b->o->op == B_REDUCE_SCATTER || b->o->op == B_ALLTOALL)
        n /= (size_t)b->size; /* per-rank count */
    return n;
}

static int run_op(bench_ctx *b, size_t count, int inplace)
{
    char *s = inplace ? b->recv : b->send;
    dt_dtype t = b->o->dtype;
    switch (b->o->op) {
    case B_ALLREDUCE: return dt_allreduce(b->c, s, b->recv, count, t, DT_SUM);
    case B_ALLGATHER:
        return dt_allgather(b->c, inplace ? b->recv + (size_t)b->rank * count * b->esz : s,
                            b->recv, count, t);
    case B_REDUCE_SCATTER: return dt_reduce_scatter(b->c, s, b->recv, count, t, DT_SUM);
    case B_BROADCAST: return dt_broadcast(b->c, s, b->recv, count, t, 0);
    case B_ALLTOALL: return dt_alltoall(b->c, s, b->recv, count, t);
    }
    return DT_ERR_INVALID;
}

static double value_of(int rank, size_t i) { return (double)((int)(i % 5) + rank % 3); }

static void fill_inputs(bench_ctx *b, size_t n_send, int inplace)
{
    char *dst = inplace ? b->recv : b->send;
    for (size_t i = 0; i < n_send; i++) {
        float v = (float)value_of(b->rank, i);
        switch (b->o->dtype) {
        case DT_F32: ((float *)dst)[i] = v; break;
        case DT_F64: ((double *)dst)[i] = v; break;
        case DT_BF16: ((uint16_t *)dst)[i] = dt_f32_to_bf16(v); break;
        case DT_F16: ((uint16_t *)dst)[i] = dt_f32_to_f16(v); break;
        case DT_I32: ((int32_t *)dst)[i] = (int32_t)v; break;
        case DT_I64: ((int64_t *)dst)[i] = (int64_t)v; break;
        case DT_U8: ((uint8_t *)dst)[i] = (uint8_t)v; break;
        default: break;
        }
    }
}

static double elem(const bench_ctx *b, size_t i)
{
    const char *p = b->recv;
    switch (b->o->dtype) {
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

/* Elements of recv that differ from the exact expected result. */
static long count_wrong(const bench_ctx *b, size_t count)
{
    long wrong = 0;
    int p = b->size;
    size_t n = b->o->op == B_ALLGATHER || b->o->op == B_ALLTOALL ? count * (size_t)p : count;
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        switch (b->o->op) {
        case B_ALLREDUCE:
            for (int r = 0; r < p; r++) want += value_of(r, i);
            break;
        case B_REDUCE_SCATTER:
            for (int r = 0; r < p; r++) want += value_of(r, (size_t)b->rank * count + i);
            break;
        case B_ALLGATHER: want = value_of((int)(i / count), i % count); break;
        case B_BROADCAST: want = value_of(0, i); break;
        case B_ALLTOALL: want = value_of((int)(i / count), (size_t)b->rank * count + i % count); break;
        }
        if (b->o->dtype == DT_U8) want = (double)((long)want & 0xff);
        wrong += elem(b, i) != want;
    }
    return wrong;
}

static double bus_factor(const bench_ctx *b)
{
    double p = b->size;
    switch (b->o->op) {
    case B_ALLREDUCE: return 2 * (p - 1) / p;
    case B_BROADCAST: return 1;
    default: return (p - 1) / p;
    }
}

/* Average time of one call in microseconds (the slowest rank's), and #wrong. */
static int measure(bench_ctx *b, size_t count, int inplace, int iters, double *us, long *wrong)
{
    size_t n_send = b->o->op == B_REDUCE_SCATTER || b->o->op == B_ALLTOALL
                        ? count * (size_t)b->size
                        : count;
    int rc = 0;
    for (int i = 0; i < b->o->warmup && rc == 0; i++) {
        fill_inputs(b, n_send, inplace);
        rc = run_op(b, count, inplace);
    }
    fill_inputs(b, n_send, inplace);
    if (rc == 0) rc = run_op(b, count, inplace);
    long w = rc == 0 ? count_wrong(b, count) : 0;
    if (rc == 0) rc = dt_barrier(b->c);
    /* Timed calls reuse the inputs (in place they compound, as in
     * nccl-tests); the check above ran on fresh inputs. */
    uint64_t t0 = dt_now_ns();
    for (int i = 0; i < iters && rc == 0; i++) rc = run_op(b, count, inplace);
    double t = (double)(dt_now_ns() - t0) / 1e3 / iters;
    if (rc == 0) rc = dt_allreduce(b->c, &t, us, 1, DT_F64, DT_MAX);
    int64_t wl = w, wsum = 0;
    if (rc == 0) rc = dt_allreduce(b->c, &wl, &wsum, 1, DT_I64, DT_SUM);
    *wrong = (long)wsum;
    return rc;
}

static int iters_for(const bench_opts *o, size_t bytes)
{
    if (o->iters) return o->iters;
    if (bytes <= (64u << 10)) return 1000;
    if (bytes <= (4u << 20)) return 100;
    return 20;
}

static int run_bench(dt_comm *c, const bench_opts *o)
{
    bench_ctx b = {c, o, dt_comm_rank(c), dt_comm_size(c), dt_dtype_size(o->dtype), NULL, NULL};
    size_t alloc = o->max_bytes + 64 * b.esz * (size_t)b.size;
    b.send = calloc(1, alloc);
    b.recv = calloc(1, alloc);
    if (!b.send || !b.recv) {
        fprintf(stderr, "dtrain bench comm: cannot allocate %zu bytes\n", 2 * alloc);
        return 1;
    }
    if (b.rank == 0) {
        printf("# dtrain bench comm: %s, %d ranks over %s, dtype %s\n", op_names[o->op], b.size,
               dt_comm_transport(c), dt_dtype_name(o->dtype));
        printf("#%11s %12s %6s %6s %5s %9s %8s %8s %7s %9s %8s %8s %7s\n", "size", "count", "type",
               "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
               "#wrong");
        printf("#%11s %12s %6s %6s %5s %9s %8s %8s %7s %9s %8s %8s %7s\n", "(B)", "(elements)", "",
               "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    }
    double bus_sum = 0;
    int rows = 0, rc = 0;
    long total_wrong = 0;
    for (double s = (double)o->min_bytes; s <= (double)o->max_bytes && rc == 0; s *= o->factor) {
        size_t count = elems_in(&b, (size_t)s);
        size_t bytes = o->op == B_ALLGATHER || o->op == B_REDUCE_SCATTER || o->op == B_ALLTOALL
                           ? count * b.esz * (size_t)b.size
                           : count * b.esz;
        int iters = iters_for(o, bytes);
        double t[2];
        long w[2];
        for (int ip = 0; ip < 2 && rc == 0; ip++) rc = measure(&b, count, ip, iters, &t[ip], &w[ip]);
        if (rc) break;
        double alg[2], bus[2];
        for (int ip = 0; ip < 2; ip++) {
            alg[ip] = t[ip] > 0 ? (double)bytes / t[ip] / 1e3 : 0;
            bus[ip] = alg[ip] * bus_factor(&b);
        }
        bus_sum += bus[0];
        rows++;
        total_wrong += w[0] + w[1];
        if (b.rank == 0)
            printf(" %11zu %12zu %6s %6s %5d %9.2f %8.2f %8.2f %7ld %9.2f %8.2f %8.2f %7ld\n",
                   bytes, count, dt_dtype_name(o->dtype),
                   o->op == B_ALLREDUCE || o->op == B_REDUCE_SCATTER ? "sum" : "none",
                   o->op == B_BROADCAST ? 0 : -1, t[0], alg[0], bus[0], w[0], t[1], alg[1], bus[1],
                   w[1]);
        if (s == 0) break;
    }
    if (rc) {
        fprintf(stderr, "dtrain bench comm: rank %d: %s\n", b.rank, dt_comm_error(c));
    } else if (b.rank == 0) {
        printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %.3f GB/s\n", rows ? bus_sum / rows : 0);
    }
    free(b.send);
    free(b.recv);
    return rc ? 1 : total_wrong ? 1 : 0;
}

int cli_bench_comm(int argc, char **argv)
{
    bench_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    if (o.nproc) return relaunch(argc, argv, o.nproc);
    dt_comm *c;
    if (dt_comm_init(&c) != 0) {
        fprintf(stderr, "dtrain bench comm: %s\n", dt_last_error());
        return 1;
    }
    rc = run_bench(c, &o);
    dt_comm_destroy(c);
    return rc;
}

int cli_bench(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "comm")) return cli_bench_comm(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: dtrain bench comm [options]   (see dtrain bench comm --help)\n");
        return 0;
    }
    fprintf(stderr, "usage: dtrain bench comm [options]\n");
    return CLI_EXIT_USAGE;
}
