/*
 * `dtrain bench comm`, shared between its files:
 *   bench_comm.c          options, relaunching under a launcher, the driver
 *   bench_comm_measure.c  inputs, the exact check, timing one point, copy bandwidth
 *   bench_comm_report.c   the nccl-tests table, CSV rows and --explain
 */
#ifndef DT_CLI_BENCH_COMM_H
#define DT_CLI_BENCH_COMM_H

#include <stddef.h>
#include <stdio.h>

#include "dtrain/comm.h"

#define BENCH "dtrain bench comm"

typedef enum {
    B_ALLREDUCE,
    B_ALLGATHER,
    B_REDUCE_SCATTER,
    B_BROADCAST,
    B_ALLTOALL,
    B_ALLTOALLV,
    B_NOPS
} bench_op;

/* The collective's name, as dt_comm_set_algo spells it. */
extern const char *const bench_op_names[B_NOPS];

/* Names an op's algorithm list may hold (auto, the table's, all). */
#define BENCH_MAX_ALGOS 24

typedef struct {
    int op_on[B_NOPS]; /* ops to run */
    int op_given, algo_given, format_given;
    const char *algo; /* --algo as given, or NULL */
    size_t min_bytes, max_bytes;
    double factor;
    dt_dtype dtype;
    int iters, warmup; /* iters 0: by size */
    int nproc;
    int peer_mpi;
    int plain_buffers; /* --buffers malloc */
    int csv;
    int explain;
    int calibrate;
    const char *calibrate_path; /* NULL: do not save */
} bench_opts;

/* One message size of an op's sweep. */
typedef struct {
    size_t count; /* the call's count: per rank for all-gather, reduce-scatter, all-to-all;
                   * for all-to-all-v the elements of one weight (bench_v_count) */
    size_t bytes; /* nccl-tests size: the whole message (all-to-all-v: what a rank sends) */
} bench_size;

/* What one rank holds while benchmarking. */
typedef struct {
    dt_comm *c;
    const bench_opts *o;
    int rank, size;
    size_t esz;
    char *send, *recv;
    size_t alloc;
    size_t *v; /* all-to-all-v: send counts, displacements, receive counts, displacements */
    double copy_gbps; /* rank 0: memcpy bandwidth measured at start */
    double copy_all_gbps; /* a rank's, every rank copying at once (the slowest rank's) */
    FILE *note;       /* where notes go: stdout for tables, stderr for CSV */
} bench_ctx;

/* One timed point: the slowest rank's average, the fastest rank's, the
 * mean over ranks (microseconds), and #wrong summed over ranks. */
typedef struct {
    double us, min_us, avg_us;
    long wrong;
    int iters;
} bench_point;

/* bench_comm_measure.c */
double bench_bus_factor(bench_op op, int p);
/* Whether op has an in-place form to time (all-to-all-v has none). */
int bench_has_inplace(bench_op op);
/* The count dt_comm_algo_for and dt_comm_predict_us take for a size: the
 * call's, or for all-to-all-v its largest per-peer count. */
size_t bench_algo_count(const bench_ctx *b, bench_op op, const bench_size *s);
/* Sizes from --min-bytes to --max-bytes for op (per-rank counts of at
 * least one element; repeated sizes dropped). Returns how many; *out is
 * malloc'ed. */
int bench_sizes(const bench_ctx *b, bench_op op, bench_size **out);
int bench_iters_for(const bench_opts *o, size_t bytes);
/* Check on fresh inputs (#wrong), then time iters calls. Collective. */
int bench_measure(bench_ctx *b, bench_op op, const bench_size *s, int inplace, bench_point *pt);
/* memcpy bandwidth of a large buffer on rank 0, the others waiting (GB/s
 * on rank 0, 0 elsewhere). Collective. */
int bench_copy_bandwidth(bench_ctx *b, double *gbps, size_t *bytes);

/* bench_comm_report.c: every selected op, in the format asked for.
 * Returns 0, 1 (a call failed or #wrong), or 2 (a usage problem found
 * only once running, such as --peer mpi without MPI). */
int bench_run_all(bench_ctx *b);
/* The job's cost model, each line commented with "# ". */
void bench_print_model(bench_ctx *b, FILE *f);

#endif
