/*
 * Matrix products on oneDNN.
 *   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] (+ bias[N] per row) + beta * C
 *
 * Each call finds its primitive in the plan table (matmul_plans.c) and runs
 * it on the calling thread's stream and scratchpad (matmul_workspace.c).
 *
 * bf16: oneDNN 2.6 ignores the bf16 fpmath mode for fp32 matmuls (measured:
 * the same ~110 GFLOP/s as fp32), while a bf16 x bf16 -> fp32 primitive runs
 * on AVX512-BF16 at ~215. So fp32 operands are rounded (to nearest even)
 * into bf16 buffers of the calling thread first, which costs 5-10% of the
 * product at the model's shapes.
 *
 * oneDNN has no bf16 matmul for CPUs without AVX-512 (Zen 3, older Intel).
 * There the rounded operands are widened back to fp32 (exact) and an fp32
 * primitive multiplies them: the same bf16 values and fp32 sums, at fp32
 * speed (dt_matmul_bf16_native says which).
 *
 * Most fp32 products go to oneDNN's own sgemm instead of the matmul
 * primitive: measured at one thread on an AVX-512 EPYC, at the model's
 * shapes, sgemm runs forward and the weight gradients (inp^T @ dout) at
 * 95-98% of peak where the primitive reaches 91-94%, and with B transposed
 * it is 4-5% ahead when N > K (dout @ W^T into a wide layer) and 1-6%
 * behind otherwise, where the primitive stays. That rule is where a run
 * starts; a trainer that gives a paths file (matmul_paths.h) has each
 * shape class timed on each path once per CPU, and another path takes the
 * shapes it wins by 10% (on an Intel Xeon, the primitive the tall weight
 * gradient [4C, C] += inp^T @ dout: 84% of peak against sgemm's 58-71%;
 * a long K in pieces of 256, each piece's product added to the sum of
 * those before: the weight gradients over 2048 tokens 15-25% faster).
 * Either way the path depends only on the problem and the host's file, so
 * every rank and every run on a host multiplies a shape the same way. (sgemm's
 * kernels move the stack pointer into the heap while they run: no signal
 * handler may interrupt them, see train/stop_signals.h.)
 * An accumulating fp32 product (dW +=) is formed whole in a scratch block
 * and then added, on every path (sgemm would fold beta C in with its first
 * block of K): C + (A @ B), bit for bit, the same sum as a gradient formed
 * apart and then added (what a rank's gradient is to the all-reduce).
 */
#include "kernels/matmul.h"

#include <oneapi/dnnl/dnnl_debug.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/half.h"
#include "core/timer.h"
#include "kernels/matmul_paths.h"
#include "kernels/matmul_plans.h"
#include "kernels/matmul_problem.h"
#include "kernels/matmul_workspace.h"
#include "kernels/profile.h"
#include "kernels/threads.h"

/* ---- errors ------------------------------------------------------------- */

static _Thread_local char error_message[320];

const char *dt_matmul_error(void) { return error_message; }

static int fail(const dt_matmul_problem *p, const char *fmt, ...)
{
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(error_message, sizeof error_message,
             "dt_matmul %s M=%d N=%d K=%d transA=%d transB=%d lda=%d ldb=%d ldc=%d: %s",
             p->prec == DT_PREC_BF16 ? "bf16" : "fp32", p->M, p->N, p->K, p->transA, p->transB,
             p->lda, p->ldb, p->ldc, what);
    return -1;
}

static int check_problem(const dt_matmul_problem *p)
{
    int a_cols = p->transA ? p->M : p->K, b_cols = p->transB ? p->K : p->N;
    if (p->M < 0 || p->N < 0 || p->K < 0) return fail(p, "negative size");
    if (p->lda < (a_cols > 1 ? a_cols : 1) || p->ldb < (b_cols > 1 ? b_cols : 1) ||
        p->ldc < (p->N > 1 ? p->N : 1))
        return fail(p, "leading dimension smaller than the stored row");
    if (p->prec != DT_PREC_F32 && p->prec != DT_PREC_BF16) return fail(p, "unknown precision");
    if ((p->A16 || p->B16) && p->prec != DT_PREC_BF16)
        return fail(p, "bf16 operands given for an fp32 product");
    if (p->bias && p->alpha != 1.0f) return fail(p, "bias with alpha != 1");
    if ((!p->A && !p->A16) || (!p->B && !p->B16) || !p->C) return fail(p, "NULL matrix");
    return 0;
}

/* ---- bf16 operands ------------------------------------------------------ */

/* below this many elements a pass over a matrix runs on one thread */
#define PASS_PARALLEL_MIN_ELEMS (1 << 15)

void dt_matmul_round_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld)
{
    int nt = (size_t)rows * cols >= PASS_PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < rows; r++) {
        uint16_t *out = dst + (size_t)r * cols;
        const float *in = src + (size_t)r * ld;
#pragma omp simd
        for (int c = 0; c < cols; c++) out[c] = dt_f32_to_bf16(in[c]);
    }
}

static dt_mm_workspace *workspace(void)
{
    dnnl_engine_t engine;
    return dt_mm_engine(&engine) == dnnl_success ? dt_mm_thread_workspace(engine) : NULL;
}

uint16_t *dt_matmul_bf16_buffer(size_t elems)
{
    dt_mm_workspace *ws = workspace();
    size_t bytes = elems * sizeof(uint16_t);
    if (!ws || dt_mm_reserve((void **)&ws->shared16, &ws->shared16_bytes, bytes, DT_MEM_ACTS))
        return NULL;
    return ws->shared16;
}

int dt_matmul_bf16_native(void) { return dt_mm_bf16_native(); }
const char *dt_matmul_bf16_how(void) { return dt_mm_bf16_how(); }
int dt_matmul_bf16_rates_matter(void) { return dt_mm_bf16_rates_matter(); }
int dt_matmul_bf16_choose(double fp32_rate, double bf16_rate)
{
    return dt_mm_bf16_choose(fp32_rate, bf16_rate);
}

/* fp32 rows x cols (row stride ld) rounded to bf16 into *buf, packed. */
static int round_operand(uint16_t **buf, size_t *have, const float *src, int rows, int cols,
                         int ld)
{
    size_t bytes = (size_t)rows * cols * sizeof(uint16_t);
    if (dt_mm_reserve((void **)buf, have, bytes, DT_MEM_ACTS)) return -1;
    dt_matmul_round_bf16(*buf, src, rows, cols, ld);
    return cols;
}

/* Without a bf16 kernel the products run in fp32 on operands held at
 * bf16's precision: fp32 ones rounded (to nearest even, as above) or bf16
 * ones widened into *buf in one pass. The products are those of a bf16
 * kernel that accumulates in fp32. */
static int emulate_operand(float **buf, size_t *have, const float *src, const uint16_t *src16,
                           int rows, int cols, int ld)
{
    size_t bytes = (size_t)rows * cols * sizeof(float);
    if (dt_mm_reserve((void **)buf, have, bytes, DT_MEM_ACTS)) return -1;
    int nt = (size_t)rows * cols >= PASS_PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1;
    float *dst = *buf;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < rows; r++) {
        float *out = dst + (size_t)r * cols;
        if (src16) {
            const uint16_t *in = src16 + (size_t)r * ld;
#pragma omp simd
            for (int c = 0; c < cols; c++) out[c] = dt_bf16_to_f32(in[c]);
        } else {
            const float *in = src + (size_t)r * ld;
#pragma omp simd
            for (int c = 0; c < cols; c++)
                out[c] = dt_bits_as_f32(dt_bf16_rounded_bits(in[c]) & 0xffff0000u);
        }
    }
    return cols;
}

/* The operands oneDNN reads: as given (fp32, or bf16 already), rounded to
 * bf16 into the workspace, or with emulation at bf16's precision in fp32
 * (the workspace's strides then go into the key, and an fp32 key). */
static int prepare_operands(const dt_matmul_problem *p, dt_mm_workspace *ws, dt_mm_key *k,
                            const void **a, const void **b)
{
    *a = p->A16 ? (const void *)p->A16 : p->A;
    *b = p->B16 ? (const void *)p->B16 : p->B;
    if (p->prec != DT_PREC_BF16) return 0;
    int arows = p->transA ? p->K : p->M, acols = p->transA ? p->M : p->K;
    int brows = p->transB ? p->N : p->K, bcols = p->transB ? p->K : p->N;
    if (!dt_mm_bf16_native()) {
        k->lda = emulate_operand(&ws->a32, &ws->a32_bytes, p->A, p->A16, arows, acols, p->lda);
        k->ldb = emulate_operand(&ws->b32, &ws->b32_bytes, p->B, p->B16, brows, bcols, p->ldb);
        k->prec = DT_PREC_F32;
        *a = ws->a32;
        *b = ws->b32;
        return k->lda < 0 || k->ldb < 0 ? -1 : 0;
    }
    if (!p->A16) {
        k->lda = round_operand(&ws->a16, &ws->a16_bytes, p->A, arows, acols, p->lda);
        *a = ws->a16;
    }
    if (!p->B16) {
        k->ldb = round_operand(&ws->b16, &ws->b16_bytes, p->B, brows, bcols, p->ldb);
        *b = ws->b16;
    }
    return k->lda < 0 || k->ldb < 0 ? -1 : 0;
}

/* ---- execution ---------------------------------------------------------- */

/* K == 0: the product is empty, C = bias + beta * C. */
static void empty_product(const dt_matmul_problem *p)
{
    for (int i = 0; i < p->M; i++) {
        float *row = p->C + (size_t)i * p->ldc;
        for (int j = 0; j < p->N; j++)
            row[j] = (p->beta != 0.0f ? p->beta * row[j] : 0.0f) + (p->bias ? p->bias[j] : 0.0f);
    }
}

/* Wraps the buffers in memory objects (cheap: no copies) and runs. */
static dnnl_status_t execute(const dt_mm_key *k, const dt_mm_plan *plan, dt_mm_workspace *ws,
                             void *const handles[4])
{
    static const int arg_ids[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS,
                                   DNNL_ARG_SCRATCHPAD};
    dnnl_data_type_t in = k->prec == DT_PREC_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_dims_t scratch_dims = {(dnnl_dim_t)plan->scratch_bytes};
    dnnl_memory_desc_t mds[5];
    dt_mm_matrix_desc(&mds[0], k->M, k->K, k->lda, k->transA, in);
    dt_mm_matrix_desc(&mds[1], k->K, k->N, k->ldb, k->transB, in);
    dt_mm_matrix_desc(&mds[2], k->M, k->N, k->ldc, 0, dnnl_f32);
    dt_mm_bias_desc(&mds[3], k->N);
    dnnl_memory_desc_init_by_tag(&mds[4], 1, scratch_dims, dnnl_u8, dnnl_a);
    void *const all[5] = {handles[0], handles[1], handles[2], handles[3],
                          plan->scratch_bytes ? ws->scratch : NULL};
    dnnl_engine_t engine;
    dnnl_status_t s = dt_mm_engine(&engine);
    dnnl_exec_arg_t args[5];
    int nargs = 0;
    for (int i = 0; i < 5 && s == dnnl_success; i++) {
        if (!all[i]) continue;
        args[nargs].arg = arg_ids[i];
        s = dnnl_memory_create(&args[nargs].memory, &mds[i], engine, all[i]);
        if (s == dnnl_success) nargs++;
    }
    if (s == dnnl_success) s = dnnl_primitive_execute(plan->primitive, ws->stream, nargs, args);
    if (s == dnnl_success) s = dnnl_stream_wait(ws->stream);
    for (int i = 0; i < nargs; i++) dnnl_memory_destroy(args[i].memory);
    return s;
}

/* ---- fp32: sgemm or the primitive, formed whole ------------------------ */

/* An fp32 product runs in blocks of rows of at most this many elements of
 * C (16 MiB): how sgemm and the primitive block K depends on the rows they
 * are given (measured: a [2300, 1900] product over K 2048 in one call and
 * in two blocks differ in most elements), so an accumulating product,
 * whose blocks pass through a scratch, and an overwriting one must cut C
 * the same way to add up the same sums. */
#define SGEMM_BLOCK_ELEMS (1 << 22)

/* The fixed rule (see the top), for when nothing was measured. */
static dt_mm_path rule_path(const dt_matmul_problem *p)
{
    return !p->transB || p->N > p->K ? DT_MM_SGEMM : DT_MM_PRIMITIVE;
}

static int block_rows(const dt_matmul_problem *p)
{
    int block = SGEMM_BLOCK_ELEMS / p->N > 0 ? SGEMM_BLOCK_ELEMS / p->N : 1;
    return block > p->M ? p->M : block;
}

/* The part of the product that rows [m0, m0 + rows) of C and the
 * reduction's [k0, k0 + k) make: beta 0 for the first piece of K (which
 * brings the bias), 1 for the pieces added to it. */
static dt_matmul_problem part_of(const dt_matmul_problem *p, int m0, int rows, int k0, int k,
                                 float *C, int ldc)
{
    dt_matmul_problem q = *p;
    q.M = rows, q.K = k, q.C = C, q.ldc = ldc;
    q.A = p->A + (p->transA ? (size_t)k0 * p->lda + (size_t)m0 : (size_t)m0 * p->lda + k0);
    q.B = p->B + (p->transB ? (size_t)k0 : (size_t)k0 * p->ldb);
    q.beta = k0 ? 1.0f : 0.0f;
    if (k0) q.bias = NULL;
    return q;
}

/* (A @ B) + bias into C, on sgemm; a bias is copied into C first. */
static dnnl_status_t sgemm_part(const dt_matmul_problem *q)
{
    if (q->bias) {
        int nt = (size_t)q->M * q->N >= PASS_PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int i = 0; i < q->M; i++)
            memcpy(q->C + (size_t)i * q->ldc, q->bias, (size_t)q->N * sizeof(float));
    }
    return dnnl_sgemm(q->transA ? 'T' : 'N', q->transB ? 'T' : 'N', q->M, q->N, q->K, q->alpha,
                      q->A, q->lda, q->B, q->ldb, q->bias ? 1.0f : q->beta, q->C, q->ldc);
}

static int primitive_solve(const dt_matmul_problem *p, dt_mm_workspace *ws);

/* Rows [m0, m0 + rows) of (A @ B) + bias into C (row stride ldc), over K
 * whole or piece by piece, on the path's kernel. */
static int rows_on(dt_mm_path path, const dt_matmul_problem *p, dt_mm_workspace *ws, int m0,
                   int rows, float *C, int ldc)
{
    int piece = dt_mm_path_pieces(path) ? DT_MM_K_PIECE : p->K;
    for (int k0 = 0; k0 < p->K; k0 += piece) {
        dt_matmul_problem q = part_of(p, m0, rows, k0, p->K - k0 < piece ? p->K - k0 : piece, C,
                                      ldc);
        if (!dt_mm_path_sgemm(path)) {
            if (primitive_solve(&q, ws)) return -1;
            continue;
        }
        dnnl_status_t s = sgemm_part(&q);
        if (s != dnnl_success) return fail(p, "oneDNN sgemm: %s", dnnl_status2str(s));
    }
    return 0;
}

/* C = beta C + (alpha A @ B + bias), in blocks of rows: each block's
 * product goes straight into C or, when beta is not 0, into the scratch
 * and is then added, so an accumulated product is C plus the product
 * formed alone, bit for bit, on every path. */
static int fp32_solve(const dt_matmul_problem *p, dt_mm_workspace *ws, dt_mm_path path)
{
    int block = block_rows(p);
    size_t bytes = (size_t)block * p->N * sizeof(float);
    if (p->beta != 0.0f && dt_mm_reserve((void **)&ws->c32, &ws->c32_bytes, bytes, DT_MEM_OTHER))
        return fail(p, "out of memory for a %zu-byte block of the product", bytes);
    for (int m0 = 0; m0 < p->M; m0 += block) {
        int rows = p->M - m0 < block ? p->M - m0 : block;
        float *C = p->C + (size_t)m0 * p->ldc;
        if (p->beta == 0.0f) {
            if (rows_on(path, p, ws, m0, rows, C, p->ldc)) return -1;
            continue;
        }
        if (rows_on(path, p, ws, m0, rows, ws->c32, p->N)) return -1;
        int nt = (size_t)rows * p->N >= PASS_PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int i = 0; i < rows; i++) {
            float *c = C + (size_t)i * p->ldc;
            const float *d = ws->c32 + (size_t)i * p->N;
#pragma omp simd
            for (int j = 0; j < p->N; j++) c[j] = p->beta * c[j] + d[j];
        }
    }
    return 0;
}

/* ---- choosing the fp32 path by measurement (matmul_paths.h) -------------- */

typedef struct {
    dt_matmul_problem q; /* the product to time: beta 0, into C or a scratch */
    dt_mm_workspace *ws;
} timing;

static double time_path(void *ctx, dt_mm_path path)
{
    timing *t = ctx;
    double t0 = dt_now_s();
    if (fp32_solve(&t->q, t->ws, path)) return -1;
    return dt_now_s() - t0;
}

/* Timed on the product's first block of rows, which is how every block
 * runs (fp32_solve): an overwriting product in place (its C is written
 * next anyway), an accumulating one in the block scratch fp32_solve
 * reserves for it (timed with beta 0, which leaves the scratch alone). */
static dt_mm_path choose_path(const dt_matmul_problem *p, dt_mm_workspace *ws)
{
    if (p->bias && p->beta != 0.0f) return DT_MM_PRIMITIVE; /* sgemm cannot add both */
    timing t = {*p, ws};
    t.q.beta = 0.0f, t.q.M = block_rows(p);
    if (p->beta != 0.0f) {
        size_t bytes = (size_t)t.q.M * p->N * sizeof(float);
        if (dt_mm_reserve((void **)&ws->c32, &ws->c32_bytes, bytes, DT_MEM_OTHER))
            return rule_path(p); /* fp32_solve reports the memory */
        t.q.C = ws->c32, t.q.ldc = p->N;
    }
    return dt_mm_path_choose(p->transA, p->transB, p->M, p->N, p->K, rule_path(p),
                             2.0 * t.q.M * p->N * p->K, time_path, &t);
}

/* ---- the entry ------------------------------------------------------------ */

/* bf16 (and fp32 on the primitive): one oneDNN matmul. */
static int primitive_solve(const dt_matmul_problem *p, dt_mm_workspace *ws)
{
    dt_mm_key k = {p->prec, !!p->transA, !!p->transB, p->M, p->N, p->K, p->lda, p->ldb, p->ldc,
                   p->bias != NULL, dt_kernels_threads(), p->alpha, p->beta};
    const void *a, *b;
    if (prepare_operands(p, ws, &k, &a, &b)) return fail(p, "out of memory for bf16 operands");

    dt_mm_plan plan;
    dnnl_status_t s = dt_mm_plan_for(&k, &plan);
    if (s != dnnl_success) return fail(p, "creating the oneDNN matmul: %s", dnnl_status2str(s));
    /* oneDNN's own scratchpad (its size depends on the CPU's kernels: none
     * with AVX2, tens of KiB with AVX-512): kernel memory, not activations. */
    if (dt_mm_reserve(&ws->scratch, &ws->scratch_bytes, plan.scratch_bytes, DT_MEM_OTHER)) {
        dt_mm_plan_release(&plan);
        return fail(p, "out of memory for a %zu-byte scratchpad", plan.scratch_bytes);
    }
    void *const handles[4] = {(void *)a, (void *)b, p->C, (void *)p->bias};
    s = execute(&k, &plan, ws, handles);
    dt_mm_plan_release(&plan);
    return s == dnnl_success ? 0 : fail(p, "running the oneDNN matmul: %s", dnnl_status2str(s));
}

/* *path: how it ran, for the profile's products by shape. */
static int matmul_solve_body(const dt_matmul_problem *p, const char **path)
{
    *path = p->prec != DT_PREC_BF16 ? "matmul" : dt_mm_bf16_native() ? "bf16" : "bf16 in fp32";
    if (check_problem(p)) return -1;
    if (p->M == 0 || p->N == 0) return 0;
    if (p->K == 0) {
        empty_product(p);
        return 0;
    }
    dt_mm_workspace *ws = workspace();
    if (!ws) return fail(p, "no oneDNN CPU engine or stream (out of memory?)");
    if (p->prec != DT_PREC_F32) return primitive_solve(p, ws);
    dt_kernels_threads(); /* sgemm takes the OpenMP thread count of its caller */
    static const char *const shown[DT_MM_PATHS] = {"matmul", "sgemm", "matmul/k256",
                                                   "sgemm/k256"};
    dt_mm_path chosen = choose_path(p, ws);
    *path = shown[chosen];
    return fp32_solve(p, ws, chosen);
}

int dt_matmul_solve(const dt_matmul_problem *p)
{
    const uint64_t t0 = dt_prof_begin();
    const char *path;
    const int r = matmul_solve_body(p, &path);
    /* Operands read (2 bytes each in bf16), the result written (and read
     * when it accumulates). */
    const double size = p->prec == DT_PREC_BF16 ? 2.0 : 4.0;
    const double flops = 2.0 * p->M * p->N * p->K;
    const uint64_t ns = dt_prof_end(DT_PROF_MATMUL, t0, flops,
                                     size * ((double)p->M * p->K + (double)p->K * p->N) +
                                         (p->beta != 0.0f ? 8.0 : 4.0) * p->M * p->N);
    const dt_prof_shape key = {p->M, p->N, p->K, !!p->transA, !!p->transB, path, 0, 0, 0};
    dt_prof_shape_add(&key, t0, ns, flops);
    return r;
}

int dt_matmul(dt_precision prec, int transA, int transB, int M, int N, int K, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    dt_matmul_problem p = {.prec = prec, .transA = transA, .transB = transB, .M = M, .N = N,
                           .K = K, .alpha = alpha, .beta = beta, .A = A, .B = B, .lda = lda,
                           .ldb = ldb, .ldc = ldc, .C = C};
    return dt_matmul_solve(&p);
}
