/* Which way a product runs on this CPU, measured rather than fixed: on
 * oneDNN's sgemm or its matmul primitive, and over all of K at once or over
 * K in pieces.
 *
 * The rule in matmul.c (sgemm, except B transposed into a narrow result)
 * came from one CPU; on another the primitive wins some shapes by 20% (an
 * Intel Xeon: A^T @ B with M = 4N, a weight gradient, 84% of peak against
 * sgemm's 58-71%). Inside training the same Xeon ran the weight
 * gradients over 2048 tokens 15-25% faster as a sum of products over 256
 * tokens each than as one product. So once a product file is given (the trainer gives one per CPU in
 * its cache directory), the first product of each shape class at or above
 * DT_MM_PATHS_MIN_FLOPS runs each way into a scratch, and the fastest path
 * replaces the rule when it was at least 10% faster.
 *
 * The path decides the bits, so every process on the host must take the
 * same one for a shape: the decision is written to the file under an
 * exclusive lock, and a process that finds the shape there takes the file's
 * answer instead of measuring. The first to measure decides for every run
 * on the host after it (delete the file to measure again).
 *
 * A shape class rounds M, N and K up to 2^k or 1.5 x 2^k, so the products
 * whose sizes follow the data (a mixture of experts' per-expert tokens)
 * reach a few classes, not one per step. Below the threshold, without a
 * file, and for bf16, the rule stands. */
#ifndef DT_KERNELS_MATMUL_PATHS_H
#define DT_KERNELS_MATMUL_PATHS_H

#include <stddef.h>

/* 2 M N K below this: the rule (a product of a few ms at one thread
 * costs less than timing it would save; and a test suite's small models,
 * run once each, would spend their time timing). */
#define DT_MM_PATHS_MIN_FLOPS 5e8

typedef struct {
    int transA, transB, M, N, K; /* the class: sizes rounded up */
} dt_mm_class;

/* The paths. A path in pieces forms the product over K = [0, 256) first,
 * then adds the product over [256, 512) to it, and so on, each piece on
 * the same kernel. */
typedef enum {
    DT_MM_PRIMITIVE,
    DT_MM_SGEMM,
    DT_MM_PRIMITIVE_PIECES,
    DT_MM_SGEMM_PIECES,
    DT_MM_PATHS
} dt_mm_path;

#define DT_MM_K_PIECE 256

static inline int dt_mm_path_sgemm(dt_mm_path p)
{
    return p == DT_MM_SGEMM || p == DT_MM_SGEMM_PIECES;
}
static inline int dt_mm_path_pieces(dt_mm_path p) { return p >= DT_MM_PRIMITIVE_PIECES; }

/* Times one product (its operands, into a scratch) on a path: seconds, or
 * a negative value when that path failed. */
typedef double (*dt_mm_time_fn)(void *ctx, dt_mm_path path);

/* Measured products go to `file` from now on (created when missing);
 * NULL: the rule only. Returns 0, or -1 with a message in err when the
 * file exists and cannot be read. */
int dt_mm_paths_use(const char *file, char *err, size_t errlen);

/* The path for a product of these sizes whose rule says `rule` (one of the
 * two whole paths). May measure it with time(ctx, ...) first, which runs
 * timed_flops (the file's GFLOP/s are of those). */
dt_mm_path dt_mm_path_choose(int transA, int transB, int M, int N, int K, dt_mm_path rule,
                             double timed_flops, dt_mm_time_fn time, void *ctx);

/* The shape classes this process has timed so far, and the seconds the
 * timing took (for a run to say why its first step was slow). */
void dt_mm_paths_timed(int *classes, double *seconds);

/* The class a size falls in: the least 2^k or 3 x 2^(k-1) at or above n. */
int dt_mm_class_size(int n);

#endif
