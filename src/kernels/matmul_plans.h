/* oneDNN matmul primitives for dt_matmul, one per distinct problem, created
 * on first use and kept (creating one costs far more than running it). */
#ifndef DT_KERNELS_MATMUL_PLANS_H
#define DT_KERNELS_MATMUL_PLANS_H

#include <oneapi/dnnl/dnnl.h>
#include <stddef.h>

/* Everything a primitive is specialised on. lda/ldb are those of the
 * operands oneDNN reads (the bf16 copies in bf16). */
typedef struct {
    int prec, transA, transB, M, N, K, lda, ldb, ldc, has_bias, threads;
    float alpha, beta;
} dt_mm_key;

typedef struct {
    dnnl_primitive_t primitive;
    size_t scratch_bytes; /* the scratchpad it needs, passed by the caller */
    int temporary;        /* made for one call (the table was full): release it */
} dt_mm_plan;

/* The process's CPU engine, created once. */
dnnl_status_t dt_mm_engine(dnnl_engine_t *out);
/* Whether bf16 products run on oneDNN's bf16 matmul: it has one for this
 * CPU (it needs AVX-512; on AVX2-only CPUs such as Zen 3 it has none), and
 * it is the faster path here (not where the fp32 FMA outruns AVX512-BF16's
 * dot products). Decided once (see dt_matmul_bf16_choose in matmul.h);
 * dt_mm_bf16_how says which and why. */
int dt_mm_bf16_native(void);
const char *dt_mm_bf16_how(void);
int dt_mm_bf16_rates_matter(void);
int dt_mm_bf16_choose(double fp32_rate, double bf16_rate);
dnnl_status_t dt_mm_plan_for(const dt_mm_key *k, dt_mm_plan *out);
void dt_mm_plan_release(dt_mm_plan *plan);

/* Row-major [rows, cols] with row stride ld, or, when transposed, the
 * transpose of a row-major [cols, rows] (row stride ld). */
dnnl_status_t dt_mm_matrix_desc(dnnl_memory_desc_t *md, int rows, int cols, int ld,
                                int transposed, dnnl_data_type_t type);
/* [1, N]: a bias row */
dnnl_status_t dt_mm_bias_desc(dnnl_memory_desc_t *md, int N);

#endif
