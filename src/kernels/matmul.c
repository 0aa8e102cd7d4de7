/*
 * Matrix products on oneDNN.
 *   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] (+ bias[N] per row) + beta * C
 *
 * Creating a oneDNN primitive costs far more than running one at these
 * sizes, so each distinct problem (shape, strides, transposes, precision,
 * alpha, beta, bias, thread count) gets its primitive once, kept in a small
 * table here. Transposes are strides in the memory descriptors, never
 * copies; beta is a sum post-op and the bias is oneDNN's own bias input,
 * both applied while the result is still in registers.
 *
 * bf16: oneDNN 2.6 ignores the bf16 fpmath mode for fp32 matmuls (measured:
 * the same ~110 GFLOP/s as fp32), while a bf16 x bf16 -> fp32 primitive runs
 * on AVX512-BF16 at ~220. So fp32 operands are rounded into bf16 buffers of
 * the calling thread first (about a tenth of the product's time at N=2048).
 *
 * Every thread that calls in gets its own stream, scratchpad and bf16
 * buffers (the scratchpad is passed by us, oneDNN's "user" mode, so two
 * threads may run the same primitive at once), freed when the thread ends.
 */
#include "kernels/matmul.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/half.h"
#include "kernels/matmul_problem.h"
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

/* ---- engine and per-thread workspace ------------------------------------ */

static dnnl_engine_t engine;
static dnnl_status_t engine_status = dnnl_runtime_error;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;

static void create_engine(void) { engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0); }

typedef struct {
    dnnl_stream_t stream;
    void *scratch;
    size_t scratch_bytes;
    uint16_t *a16, *b16;
    size_t a16_elems, b16_elems;
} workspace;

static pthread_key_t workspace_key;
static pthread_once_t workspace_once = PTHREAD_ONCE_INIT;

static void free_workspace(void *arg)
{
    workspace *ws = arg;
    if (ws->stream) dnnl_stream_destroy(ws->stream);
    dt_free(ws->scratch);
    dt_free(ws->a16);
    dt_free(ws->b16);
    dt_free(ws);
}

static void create_workspace_key(void) { pthread_key_create(&workspace_key, free_workspace); }

static workspace *thread_workspace(void)
{
    pthread_once(&workspace_once, create_workspace_key);
    workspace *ws = pthread_getspecific(workspace_key);
    if (ws) return ws;
    ws = dt_alloc(sizeof *ws, DT_MEM_ACTS);
    if (!ws) return NULL;
    if (dnnl_stream_create(&ws->stream, engine, dnnl_stream_default_flags) != dnnl_success ||
        pthread_setspecific(workspace_key, ws) != 0) {
        free_workspace(ws);
        return NULL;
    }
    return ws;
}

/* Grows *buf to hold at least `bytes` (contents not kept). */
static int reserve(void **buf, size_t *have, size_t bytes)
{
    if (*have >= bytes) return 0;
    dt_free(*buf);
    *buf = dt_alloc(bytes, DT_MEM_ACTS);
    *have = *buf ? bytes : 0;
    return *buf ? 0 : -1;
}

/* ---- plans -------------------------------------------------------------- */

typedef struct {
    int prec, transA, transB, M, N, K, lda, ldb, ldc, has_bias, threads;
    float alpha, beta;
} plan_key;

typedef struct {
    plan_key key;
    dnnl_primitive_t primitive;
    size_t scratch_bytes;
} plan;

#define PLAN_CAPACITY 512

static plan plans[PLAN_CAPACITY];
static int plan_count;
static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;

static int same_key(const plan_key *a, const plan_key *b)
{
    return a->prec == b->prec && a->transA == b->transA && a->transB == b->transB &&
           a->M == b->M && a->N == b->N && a->K == b->K && a->lda == b->lda &&
           a->ldb == b->ldb && a->ldc == b->ldc && a->has_bias == b->has_bias &&
           a->threads == b->threads && a->alpha == b->alpha && a->beta == b->beta;
}

/* Row-major [rows, cols] with row stride ld, or its transpose when
 * `transposed` (stored [cols, rows]). */
static dnnl_status_t matrix_desc(dnnl_memory_desc_t *md, int rows, int cols, int ld,
                                 int transposed, dnnl_data_type_t type)
{
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {transposed ? 1 : ld, transposed ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, type, strides);
}

static dnnl_status_t build_attr(dnnl_primitive_attr_t attr, const plan_key *k)
{
    dnnl_status_t s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success && k->alpha != 1.0f)
        s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha);
    if (s == dnnl_success && k->beta != 0.0f) {
        dnnl_post_ops_t ops;
        s = dnnl_post_ops_create(&ops);
        if (s != dnnl_success) return s;
        s = dnnl_post_ops_append_sum(ops, k->beta);
        if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(attr, ops);
        dnnl_post_ops_destroy(ops);
    }
    return s;
}

static dnnl_status_t create_primitive(const plan_key *k, dnnl_primitive_t *prim,
                                      size_t *scratch_bytes)
{
    dnnl_data_type_t in = k->prec == DT_PREC_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t a, b, c, bias;
    dnnl_dims_t bias_dims = {1, k->N}, bias_strides = {k->N, 1};
    dnnl_status_t s = matrix_desc(&a, k->M, k->K, k->lda, k->transA, in);
    if (s == dnnl_success) s = matrix_desc(&b, k->K, k->N, k->ldb, k->transB, in);
    if (s == dnnl_success) s = matrix_desc(&c, k->M, k->N, k->ldc, 0, dnnl_f32);
    if (s == dnnl_success && k->has_bias)
        s = dnnl_memory_desc_init_by_strides(&bias, 2, bias_dims, dnnl_f32, bias_strides);
    dnnl_matmul_desc_t desc;
    if (s == dnnl_success) s = dnnl_matmul_desc_init(&desc, &a, &b, k->has_bias ? &bias : NULL, &c);
    dnnl_primitive_attr_t attr;
    if (s != dnnl_success || (s = dnnl_primitive_attr_create(&attr)) != dnnl_success) return s;
    dnnl_primitive_desc_t pd = NULL;
    s = build_attr(attr, k);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) return s;
    *scratch_bytes = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
    s = dnnl_primitive_create(prim, pd);
    dnnl_primitive_desc_destroy(pd);
    return s;
}

/* The cached plan for k, created on first use. When the table is full the
 * plan is made for this call only (*temporary set; the caller destroys it). */
static dnnl_status_t find_plan(const plan_key *k, plan *out, int *temporary)
{
    pthread_mutex_lock(&plan_lock);
    for (int i = 0; i < plan_count; i++) {
        if (same_key(&plans[i].key, k)) {
            *out = plans[i];
            *temporary = 0;
            pthread_mutex_unlock(&plan_lock);
            return dnnl_success;
        }
    }
    out->key = *k;
    dnnl_status_t s = create_primitive(k, &out->primitive, &out->scratch_bytes);
    *temporary = plan_count == PLAN_CAPACITY;
    if (s == dnnl_success && !*temporary) plans[plan_count++] = *out;
    pthread_mutex_unlock(&plan_lock);
    return s;
}

/* ---- bf16 operands ------------------------------------------------------ */

#define ROUND_PARALLEL_MIN_ELEMS (1 << 15)

void dt_matmul_round_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld)
{
    int nt = (size_t)rows * cols >= ROUND_PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < rows; r++) {
        uint16_t *out = dst + (size_t)r * cols;
        const float *in = src + (size_t)r * ld;
#pragma omp simd
        for (int c = 0; c < cols; c++) out[c] = dt_f32_to_bf16(in[c]);
    }
}

/* Rounds an fp32 operand into the thread's buffer; returns its new row
 * stride (packed), or -1 when the buffer cannot grow. */
static int round_operand(uint16_t **buf, size_t *have, const float *src, int rows, int cols,
                         int ld)
{
    size_t bytes = (size_t)rows * cols * sizeof(uint16_t);
    if (reserve((void **)buf, have, bytes)) return -1;
    dt_matmul_round_bf16(*buf, src, rows, cols, ld);
    return cols;
}

/* ---- execution ---------------------------------------------------------- */

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

/* K == 0: the product is empty, C = bias + beta * C. */
static void empty_product(const dt_matmul_problem *p)
{
    for (int i = 0; i < p->M; i++) {
        float *row = p->C + (size_t)i * p->ldc;
        for (int j = 0; j < p->N; j++)
            row[j] = (p->beta != 0.0f ? p->beta * row[j] : 0.0f) + (p->bias ? p->bias[j] : 0.0f);
    }
}

static dnnl_status_t execute(const plan *pl, workspace *ws, const dnnl_memory_desc_t mds[4],
                             void *const handles[4])
{
    static const int arg_ids[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS,
                                   DNNL_ARG_SCRATCHPAD};
    dnnl_exec_arg_t args[5];
    int nargs = 0;
    dnnl_status_t s = dnnl_success;
    for (int i = 0; i < 4 && s == dnnl_success; i++) {
        if (!handles[i]) continue;
        args[nargs].arg = arg_ids[i];
        s = dnnl_memory_create(&args[nargs].memory, &mds[i], engine, handles[i]);
        if (s == dnnl_success) nargs++;
    }
    dnnl_memory_desc_t scratch_md;
    dnnl_dims_t scratch_dims = {(dnnl_dim_t)pl->scratch_bytes};
    if (s == dnnl_success && pl->scratch_bytes) {
        s = dnnl_memory_desc_init_by_tag(&scratch_md, 1, scratch_dims, dnnl_u8, dnnl_a);
        if (s == dnnl_success) s = dnnl_memory_create(&args[nargs].memory, &scratch_md, engine,
                                                      ws->scratch);
        if (s == dnnl_success) args[nargs++].arg = arg_ids[4];
    }
    if (s == dnnl_success) s = dnnl_primitive_execute(pl->primitive, ws->stream, nargs, args);
    if (s == dnnl_success) s = dnnl_stream_wait(ws->stream);
    for (int i = 0; i < nargs; i++) dnnl_memory_destroy(args[i].memory);
    return s;
}

int dt_matmul_solve(const dt_matmul_problem *p)
{
    if (check_problem(p)) return -1;
    if (p->M == 0 || p->N == 0) return 0;
    if (p->K == 0) {
        empty_product(p);
        return 0;
    }
    pthread_once(&engine_once, create_engine);
    if (engine_status != dnnl_success)
        return fail(p, "oneDNN CPU engine: %s", dnnl_status2str(engine_status));
    workspace *ws = thread_workspace();
    if (!ws) return fail(p, "out of memory for the thread's stream");

    plan_key k = {p->prec, !!p->transA, !!p->transB, p->M, p->N, p->K, p->lda, p->ldb, p->ldc,
                  p->bias != NULL, dt_kernels_threads(), p->alpha, p->beta};
    const void *a = p->A16 ? (const void *)p->A16 : p->A;
    const void *b = p->B16 ? (const void *)p->B16 : p->B;
    if (p->prec == DT_PREC_BF16 && !p->A16) {
        int rows = p->transA ? p->K : p->M, cols = p->transA ? p->M : p->K;
        k.lda = round_operand(&ws->a16, &ws->a16_elems, p->A, rows, cols, p->lda);
        a = ws->a16;
    }
    if (p->prec == DT_PREC_BF16 && !p->B16) {
        int rows = p->transB ? p->N : p->K, cols = p->transB ? p->K : p->N;
        k.ldb = round_operand(&ws->b16, &ws->b16_elems, p->B, rows, cols, p->ldb);
        b = ws->b16;
    }
    if (k.lda < 0 || k.ldb < 0) return fail(p, "out of memory for bf16 operands");

    plan pl;
    int temporary;
    dnnl_status_t s = find_plan(&k, &pl, &temporary);
    if (s != dnnl_success) return fail(p, "creating the oneDNN matmul: %s", dnnl_status2str(s));
    if (reserve(&ws->scratch, &ws->scratch_bytes, pl.scratch_bytes)) {
        if (temporary) dnnl_primitive_destroy(pl.primitive);
        return fail(p, "out of memory for a %zu-byte scratchpad", pl.scratch_bytes);
    }

    dnnl_data_type_t in = p->prec == DT_PREC_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t mds[4];
    dnnl_dims_t bias_dims = {1, p->N}, bias_strides = {p->N, 1};
    matrix_desc(&mds[0], p->M, p->K, k.lda, k.transA, in);
    matrix_desc(&mds[1], p->K, p->N, k.ldb, k.transB, in);
    matrix_desc(&mds[2], p->M, p->N, p->ldc, 0, dnnl_f32);
    dnnl_memory_desc_init_by_strides(&mds[3], 2, bias_dims, dnnl_f32, bias_strides);
    void *const handles[4] = {(void *)a, (void *)b, p->C, (void *)p->bias};
    s = execute(&pl, ws, mds, handles);
    if (temporary) dnnl_primitive_destroy(pl.primitive);
    return s == dnnl_success ? 0 : fail(p, "running the oneDNN matmul: %s", dnnl_status2str(s));
}

int dt_matmul(dt_precision prec, int transA, int transB, int M, int N, int K, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    dt_matmul_problem p = {.prec = prec, .transA = transA, .transB = transB, .M = M, .N = N,
                           .K = K, .alpha = alpha, .beta = beta, .A = A, .B = B, .lda = lda,
                           .ldb = ldb, .ldc = ldc, .C = C};
    return dt_matmul_solve(&p);
}
