/*
 * Optimizer updates, element-wise over a contiguous range.
 *   p, g, m, v, buf [n]
 * Each follows PyTorch 1.13's single-tensor code operation by operation, in
 * fp32 with the scalars rounded to fp32 where PyTorch rounds them (a Python
 * float scalar applied to a float tensor) and the bias corrections in double
 * as Python computes them, so that the results match PyTorch to the last
 * bit or two. One pass over memory; the loops vectorise and split across
 * threads.
 */
#include "kernels/optimizer.h"

#include <math.h>
#include <omp.h>

#include "kernels/profile.h"
#include "kernels/threads.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define PARALLEL_MIN_ELEMS (1 << 14)

static int threads_for(size_t n) { return n >= PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1; }

/* The scalars of one Adam step, as PyTorch derives them. decay multiplies
 * the parameter first (AdamW's decoupled weight decay, else 1); l2 adds
 * l2 * p to the gradient (Adam's weight decay, else 0). */
typedef struct {
    float grad_scale, decay, l2;
    float b1, one_minus_b1, b2, one_minus_b2, neg_step_size, bc2_sqrt, eps;
} adam_scalars;

static adam_scalars adam_step_scalars(float lr, float beta1, float beta2, float eps, int t,
                                      float grad_scale, float decay, float l2)
{
    double bc1 = 1.0 - pow((double)beta1, t), bc2 = 1.0 - pow((double)beta2, t);
    adam_scalars s = {grad_scale, decay, l2, beta1, (float)(1.0 - (double)beta1), beta2,
                      (float)(1.0 - (double)beta2), (float)(-((double)lr / bc1)),
                      (float)sqrt(bc2), eps};
    return s;
}

/* One element. Where PyTorch's vector kernels fuse (add with alpha is a
 * fused multiply-add there), so does this. */
static inline void adam_apply(float *p, const float *g, float *m, float *v, const adam_scalars *s)
{
    float gi = *g * s->grad_scale;
    gi = s->l2 != 0.0f ? fmaf(*p, s->l2, gi) : gi;
    float pi = *p * s->decay;
    float mi = fmaf(gi, s->one_minus_b1, *m * s->b1);
    float vi = *v * s->b2 + s->one_minus_b2 * gi * gi;
    float denom = sqrtf(vi) / s->bc2_sqrt + s->eps;
    *p = pi + s->neg_step_size * mi / denom;
    *m = mi;
    *v = vi;
}

#if defined(__AVX512F__)
/* Sixteen elements (fewer under the mask), the same operations in the same
 * order as adam_apply. Written out because sqrtf may set errno, which
 * keeps the compiler from vectorising the scalar loop. */
static inline void adam_apply16(float *p, const float *g, float *m, float *v,
                                const adam_scalars *s, __mmask16 k)
{
    __m512 pv = _mm512_maskz_loadu_ps(k, p), gv = _mm512_maskz_loadu_ps(k, g);
    __m512 mv = _mm512_maskz_loadu_ps(k, m), vv = _mm512_maskz_loadu_ps(k, v);
    gv = _mm512_mul_ps(gv, _mm512_set1_ps(s->grad_scale));
    if (s->l2 != 0.0f) gv = _mm512_fmadd_ps(pv, _mm512_set1_ps(s->l2), gv);
    pv = _mm512_mul_ps(pv, _mm512_set1_ps(s->decay));
    mv = _mm512_fmadd_ps(gv, _mm512_set1_ps(s->one_minus_b1),
                         _mm512_mul_ps(mv, _mm512_set1_ps(s->b1)));
    __m512 g2 = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(s->one_minus_b2), gv), gv);
    vv = _mm512_add_ps(_mm512_mul_ps(vv, _mm512_set1_ps(s->b2)), g2);
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), _mm512_set1_ps(s->bc2_sqrt)),
                                 _mm512_set1_ps(s->eps));
    __m512 step = _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(s->neg_step_size), mv), denom);
    _mm512_mask_storeu_ps(p, k, _mm512_add_ps(pv, step));
    _mm512_mask_storeu_ps(m, k, mv);
    _mm512_mask_storeu_ps(v, k, vv);
}
#endif

static void adam_all(float *p, const float *g, float *m, float *v, size_t n,
                     const adam_scalars *s)
{
#if defined(__AVX512F__)
    size_t groups = (n + 15) / 16;
#pragma omp parallel for schedule(static) num_threads(threads_for(n))
    for (size_t i = 0; i < groups; i++) {
        size_t left = n - 16 * i;
        __mmask16 k = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
        adam_apply16(p + 16 * i, g + 16 * i, m + 16 * i, v + 16 * i, s, k);
    }
#else
#pragma omp parallel for schedule(static) num_threads(threads_for(n))
    for (size_t i = 0; i < n; i++) adam_apply(p + i, g + i, m + i, v + i, s);
#endif
}

static void adamw_update_body(float *p, const float *g, float *m, float *v, size_t n, float lr,
                              float beta1, float beta2, float eps, float wd, int t,
                              float grad_scale)
{
    float decay = (float)(1.0 - (double)lr * (double)wd);
    adam_scalars s = adam_step_scalars(lr, beta1, beta2, eps, t, grad_scale, decay, 0.0f);
    adam_all(p, g, m, v, n, &s);
}

void dt_adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                     float beta1, float beta2, float eps, float wd, int t, float grad_scale)
{
    const uint64_t t0 = dt_prof_begin();
    adamw_update_body(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, grad_scale);
    dt_prof_end(DT_PROF_OPTIMIZER, t0, 14.0 * (double)n, 4.0 * 7.0 * (double)n);
}

static void adam_update_body(float *p, const float *g, float *m, float *v, size_t n, float lr,
                             float beta1, float beta2, float eps, float wd, int t, float grad_scale)
{
    adam_scalars s = adam_step_scalars(lr, beta1, beta2, eps, t, grad_scale, 1.0f, wd);
    adam_all(p, g, m, v, n, &s);
}

void dt_adam_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                    float beta1, float beta2, float eps, float wd, int t, float grad_scale)
{
    const uint64_t t0 = dt_prof_begin();
    adam_update_body(p, g, m, v, n, lr, beta1, beta2, eps, wd, t, grad_scale);
    dt_prof_end(DT_PROF_OPTIMIZER, t0, 14.0 * (double)n, 4.0 * 7.0 * (double)n);
}

static void sgd_update_body(float *p, const float *g, float *buf, size_t n, float lr,
                            float momentum, float wd, int t, float grad_scale)
{
    int use_buf = momentum != 0.0f && buf;
#pragma omp parallel for simd schedule(static) num_threads(threads_for(n))
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        gi = wd != 0.0f ? fmaf(p[i], wd, gi) : gi;
        if (use_buf) {
            gi = t == 1 ? gi : buf[i] * momentum + gi;
            buf[i] = gi;
        }
        p[i] = fmaf(gi, -lr, p[i]);
    }
}

void dt_sgd_update(float *p, const float *g, float *buf, size_t n, float lr, float momentum,
                   float wd, int t, float grad_scale)
{
    const uint64_t t0 = dt_prof_begin();
    sgd_update_body(p, g, buf, n, lr, momentum, wd, t, grad_scale);
    dt_prof_end(DT_PROF_OPTIMIZER, t0, 4.0 * (double)n, 4.0 * 5.0 * (double)n);
}

/* Each thread sums one contiguous range (static split) and the partial
 * sums are added in thread order afterwards: OpenMP's own reduction would
 * add them in whatever order the threads finish. */
static double sum_squares_body(const float *g, size_t n)
{
    int nt = threads_for(n);
    double partial[nt];
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), team = omp_get_num_threads();
        size_t lo = n / team * t + (n % team < (size_t)t ? n % team : (size_t)t);
        size_t len = n / team + ((size_t)t < n % team);
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (size_t i = lo; i < lo + len; i++) sum += (double)g[i] * (double)g[i];
        partial[t] = sum;
        if (t == 0)
            for (int k = team; k < nt; k++) partial[k] = 0.0;
    }
    double total = 0.0;
    for (int k = 0; k < nt; k++) total += partial[k];
    return total;
}

double dt_sum_squares(const float *g, size_t n)
{
    const uint64_t t0 = dt_prof_begin();
    const double r = sum_squares_body(g, n);
    dt_prof_end(DT_PROF_GRAD_NORM, t0, 2.0 * (double)n, 4.0 * (double)n);
    return r;
}

/* A block's eight lanes (lane k sums the elements at k mod 8, in order)
 * folded in pairs: the one order every block is summed in. */
static double fold_lanes(const double lane[8])
{
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

static double block_squares(const float *g, size_t n)
{
    double lane[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) lane[k] += (double)g[i + k] * (double)g[i + k];
    for (; i < n; i++) lane[i % 8] += (double)g[i] * (double)g[i];
    return fold_lanes(lane);
}

/* SIDE_BY_SIDE whole blocks (block a multiple of 8), each summed as
 * block_squares sums it, in one loop: a block alone is one chain of
 * dependent additions, and side by side the chains overlap (measured on
 * the benchmark model's 10.8M gradients, one thread: 2.9 -> 2.0 ms with
 * the gradients in cache, 5.6 -> 3.9 from memory). A square of a float is
 * exact in double, so the sums are the same bits however they are
 * scheduled. */
#define SIDE_BY_SIDE 4

static void blocks_side_by_side(const float *g, size_t block, double *out)
{
    double lane[SIDE_BY_SIDE][8] = {{0}};
    for (size_t i = 0; i < block; i += 8)
#pragma GCC unroll 4
        for (int b = 0; b < SIDE_BY_SIDE; b++) {
            const float *x = g + b * block + i;
#pragma omp simd
            for (int k = 0; k < 8; k++) lane[b][k] += (double)x[k] * (double)x[k];
        }
    for (int b = 0; b < SIDE_BY_SIDE; b++) out[b] = fold_lanes(lane[b]);
}

static void sum_squares_blocks_body(const float *g, size_t n, size_t block, double *out)
{
    long nb = (long)((n + block - 1) / block);
    long groups = (nb + SIDE_BY_SIDE - 1) / SIDE_BY_SIDE;
#pragma omp parallel for num_threads(threads_for(n)) schedule(static)
    for (long grp = 0; grp < groups; grp++) {
        long b0 = grp * SIDE_BY_SIDE;
        size_t lo = (size_t)b0 * block;
        if (block % 8 == 0 && n - lo >= SIDE_BY_SIDE * block) {
            blocks_side_by_side(g + lo, block, out + b0);
            continue;
        }
        for (long b = b0; b < nb && b < b0 + SIDE_BY_SIDE; b++) {
            size_t at = (size_t)b * block, len = n - at < block ? n - at : block;
            out[b] = block_squares(g + at, len);
        }
    }
}

void dt_sum_squares_blocks(const float *g, size_t n, size_t block, double *out)
{
    const uint64_t t0 = dt_prof_begin();
    sum_squares_blocks_body(g, n, block, out);
    dt_prof_end(DT_PROF_GRAD_NORM, t0, 2.0 * (double)n, 4.0 * (double)n);
}
