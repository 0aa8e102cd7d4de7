/*
 * The table of oneDNN matmul primitives behind dt_matmul.
 *
 * A primitive is specialised on shape, strides, transposes, precision,
 * alpha, beta, bias and the thread count (oneDNN splits the work when it
 * creates the primitive), so all of those form the key. Transposes are
 * strides in the memory descriptors, never copies; alpha is an output
 * scale, beta a sum post-op and the bias oneDNN's own input, all applied
 * while the result is still in registers. Scratchpads are passed in by the
 * caller ("user" mode), so two threads can run the same primitive at once.
 * The table is small and searched linearly under a lock: the model uses a
 * few dozen distinct products, each call costs microseconds to milliseconds.
 */
#include "kernels/matmul_plans.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "kernels/matmul.h"
#include "kernels/peak.h"

static dnnl_engine_t engine;
static dnnl_status_t engine_status = dnnl_runtime_error;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;

static void create_engine(void) { engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0); }

dnnl_status_t dt_mm_engine(dnnl_engine_t *out)
{
    pthread_once(&engine_once, create_engine);
    *out = engine;
    return engine_status;
}

/* The bf16 path: -1 until decided, once per process, either here on the
 * first bf16 product (timing the two loops) or by dt_mm_bf16_choose with
 * rates the job agreed on. */
static pthread_mutex_t bf16_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int bf16_native = -1; /* read without the lock once decided */
static char bf16_how[256];

/* A bf16 unit this much slower than the fp32 FMA's makes the fp32 path the
 * faster one (widening the rounded operands costs a few percent). Far from
 * the CPUs seen (Zen 4: 2x faster; Xeons without AMX: 2x slower). */
#define BF16_SLOWER_THAN_FP32 0.8

static int onednn_has_bf16(void)
{
    dnnl_engine_t e;
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd;
    if (dt_mm_engine(&e) != dnnl_success) return 0;
    if (dt_mm_matrix_desc(&a, 16, 16, 16, 0, dnnl_bf16) != dnnl_success ||
        dt_mm_matrix_desc(&b, 16, 16, 16, 0, dnnl_bf16) != dnnl_success ||
        dt_mm_matrix_desc(&c, 16, 16, 16, 0, dnnl_f32) != dnnl_success ||
        dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c) != dnnl_success)
        return 0;
    if (dnnl_primitive_desc_create(&pd, &desc, NULL, e, NULL) != dnnl_success) return 0;
    dnnl_primitive_desc_destroy(pd);
    return 1;
}

/* Where oneDNN's bf16 kernel would run on AVX512-BF16's dot products (no
 * AMX), whether the fp32 FMA outruns them: on Xeons without AMX one
 * vdpbf16ps issues a cycle against two fp32 FMAs, so the bf16 products
 * run at half the fp32 rate. Then they run as fp32 products of the
 * bf16-rounded values, the emulated path: the same rounded inputs, sums in
 * fp32 in another order. A rate of 0 (not measured) keeps the kernel. */
static int path_from_rates(double fp32, double bf16, char *how, size_t len)
{
    if (fp32 <= 0 || bf16 <= 0 || bf16 >= BF16_SLOWER_THAN_FP32 * fp32) return 1;
    snprintf(how, len,
             "as fp32 products of the bf16 values: this CPU's fp32 FMA (%.0f GFLOP/s a thread) "
             "outruns its bf16 dot products (%.0f); DTRAIN_BF16_EMULATE=0 takes the bf16 kernel",
             fp32 * 1e-9, bf16 * 1e-9);
    return 0;
}

/* DTRAIN_BF16_EMULATE: -1 unset, else 0 or 1 (read once; another value
 * is warned about and taken as unset). Called under bf16_lock. */
static int forced(void)
{
    static int read, value = -1;
    if (read) return value;
    read = 1;
    const char *env = getenv("DTRAIN_BF16_EMULATE");
    if (env && (!strcmp(env, "0") || !strcmp(env, "1"))) value = env[0] - '0';
    else if (env && *env)
        DT_WARN("DTRAIN_BF16_EMULATE=%s is neither 0 nor 1; choosing as if unset", env);
    return value;
}

/* The path when the loops' rates cannot change it (1 kernel, 0 emulated,
 * why in how), or -1 when they decide. =1 emulates on any CPU (tests run
 * both paths), =0 takes oneDNN's bf16 kernel wherever it has one. */
static int path_without_rates(char *how, size_t len)
{
    snprintf(how, len, "on oneDNN's bf16 kernel");
    if (forced() == 1) return snprintf(how, len, "emulated in fp32 (DTRAIN_BF16_EMULATE=1)"), 0;
    if (!onednn_has_bf16())
        return snprintf(how, len, "emulated in fp32: oneDNN has no bf16 kernel for this CPU, "
                                  "fp32 speed"), 0;
    if (forced() == 0 || dt_peak_loop_supported(DT_PEAK_BF16_AMX) ||
        !dt_peak_loop_supported(DT_PEAK_BF16_AVX512) || !dt_peak_loop_supported(DT_PEAK_F32_AVX512))
        return 1;
    return -1;
}

int dt_mm_bf16_rates_matter(void)
{
    char how[sizeof bf16_how];
    pthread_mutex_lock(&bf16_lock);
    int matter = path_without_rates(how, sizeof how) < 0;
    pthread_mutex_unlock(&bf16_lock);
    return matter;
}

int dt_mm_bf16_choose(double fp32_rate, double bf16_rate)
{
    pthread_mutex_lock(&bf16_lock);
    int native = path_without_rates(bf16_how, sizeof bf16_how);
    if (native < 0) native = path_from_rates(fp32_rate, bf16_rate, bf16_how, sizeof bf16_how);
    atomic_store_explicit(&bf16_native, native, memory_order_release);
    pthread_mutex_unlock(&bf16_lock);
    return native;
}

/* The first bf16 product decides when no one chose: both loops timed here
 * in turns (kernels/peak.h), a few tens of ms. */
static int decided(void)
{
    const int known = atomic_load_explicit(&bf16_native, memory_order_acquire);
    if (known >= 0) return known; /* every bf16 product asks: no lock then */
    pthread_mutex_lock(&bf16_lock);
    int native = atomic_load(&bf16_native); /* another thread may have decided meanwhile */
    if (native < 0) native = path_without_rates(bf16_how, sizeof bf16_how);
    if (native < 0) {
        const dt_peak_loop loops[2] = {DT_PEAK_F32_AVX512, DT_PEAK_BF16_AVX512};
        double rates[2];
        dt_peak_loop_rates(loops, 2, rates);
        native = path_from_rates(rates[0], rates[1], bf16_how, sizeof bf16_how);
    }
    atomic_store_explicit(&bf16_native, native, memory_order_release);
    pthread_mutex_unlock(&bf16_lock);
    return native;
}

const char *dt_mm_bf16_how(void)
{
    (void)decided();
    return bf16_how;
}

int dt_mm_bf16_native(void) { return decided(); }

dnnl_status_t dt_mm_matrix_desc(dnnl_memory_desc_t *md, int rows, int cols, int ld,
                                int transposed, dnnl_data_type_t type)
{
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {transposed ? 1 : ld, transposed ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, type, strides);
}

dnnl_status_t dt_mm_bias_desc(dnnl_memory_desc_t *md, int N)
{
    dnnl_dims_t dims = {1, N}, strides = {N, 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_f32, strides);
}

static dnnl_status_t build_attr(dnnl_primitive_attr_t attr, const dt_mm_key *k)
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

static dnnl_status_t matmul_desc(dnnl_matmul_desc_t *desc, const dt_mm_key *k)
{
    dnnl_data_type_t in = k->prec == DT_PREC_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t a, b, c, bias;
    dnnl_status_t s = dt_mm_matrix_desc(&a, k->M, k->K, k->lda, k->transA, in);
    if (s == dnnl_success) s = dt_mm_matrix_desc(&b, k->K, k->N, k->ldb, k->transB, in);
    if (s == dnnl_success) s = dt_mm_matrix_desc(&c, k->M, k->N, k->ldc, 0, dnnl_f32);
    if (s == dnnl_success && k->has_bias) s = dt_mm_bias_desc(&bias, k->N);
    if (s == dnnl_success) s = dnnl_matmul_desc_init(desc, &a, &b, k->has_bias ? &bias : NULL, &c);
    return s;
}

static dnnl_status_t create_primitive(const dt_mm_key *k, dt_mm_plan *plan)
{
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr;
    dnnl_status_t s = matmul_desc(&desc, k);
    if (s != dnnl_success || (s = dnnl_primitive_attr_create(&attr)) != dnnl_success) return s;
    dnnl_primitive_desc_t pd = NULL;
    s = build_attr(attr, k);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) return s;
    const dnnl_memory_desc_t *scratch = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    plan->scratch_bytes = dnnl_memory_desc_get_size(scratch);
    s = dnnl_primitive_create(&plan->primitive, pd);
    dnnl_primitive_desc_destroy(pd);
    return s;
}

/* ---- the table ---------------------------------------------------------- */

#define PLAN_CAPACITY 512

typedef struct {
    dt_mm_key key;
    dt_mm_plan plan;
} entry;

static entry table[PLAN_CAPACITY];
static int table_size;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

static int same_key(const dt_mm_key *a, const dt_mm_key *b)
{
    return a->prec == b->prec && a->transA == b->transA && a->transB == b->transB &&
           a->M == b->M && a->N == b->N && a->K == b->K && a->lda == b->lda &&
           a->ldb == b->ldb && a->ldc == b->ldc && a->has_bias == b->has_bias &&
           a->threads == b->threads && a->alpha == b->alpha && a->beta == b->beta;
}

/* The cached plan for k, created on first use. When the table is full the
 * plan is made for this call only (temporary; dt_mm_plan_release ends it). */
dnnl_status_t dt_mm_plan_for(const dt_mm_key *k, dt_mm_plan *out)
{
    dnnl_engine_t e;
    dnnl_status_t s = dt_mm_engine(&e);
    if (s != dnnl_success) return s;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < table_size; i++) {
        if (same_key(&table[i].key, k)) {
            *out = table[i].plan;
            pthread_mutex_unlock(&table_lock);
            return dnnl_success;
        }
    }
    s = create_primitive(k, out);
    out->temporary = table_size == PLAN_CAPACITY;
    if (s == dnnl_success && !out->temporary) table[table_size++] = (entry){*k, *out};
    pthread_mutex_unlock(&table_lock);
    return s;
}

void dt_mm_plan_release(dt_mm_plan *plan)
{
    if (plan->temporary) dnnl_primitive_destroy(plan->primitive);
    plan->temporary = 0;
}
