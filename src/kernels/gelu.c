/*
 * GELU with the tanh approximation, as PyTorch's approximate="tanh":
 *   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
 *   x, out, dout, dx [n]
 * 0.5 (1 + tanh(u)) equals s = 1 / (1 + e), e = exp(-2u), the logistic
 * sigmoid of 2u: one exp, and no precision lost where tanh(u) is near -1
 * (as 1 + tanh(u) loses it). For the gradient, 0.5 (1 - tanh(u)^2) =
 * 2 s (1 - s) = 2 e s^2, again without the cancellation of 1 - s near 1:
 *   gelu'(x) = s + 2 x e s^2 du/dx.
 */
#include "kernels/gelu.h"

#include "kernels/fast_exp.h"
#include "kernels/profile.h"
#include "kernels/threads.h"

#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_CUBIC 0.044715f
#define PARALLEL_MIN_ELEMS (1 << 14)

static inline float half_one_plus_tanh(float u) { return 1.0f / (1.0f + dt_fast_expf(-2.0f * u)); }

/* e stays finite (e s^2 would be inf * 0 for very negative x); the
 * clamped s, about 1e-35, is then as good as 0 there */
#define MAX_EXP_ARG 80.0f

static inline float gelu_of(float x)
{
    float u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    return x * half_one_plus_tanh(u);
}

static inline float gelu_slope(float x)
{
    float u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    float du_dx = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * x * x);
    float minus_2u = -2.0f * u;
    float e = dt_fast_expf(minus_2u < MAX_EXP_ARG ? minus_2u : MAX_EXP_ARG);
    float s = 1.0f / (1.0f + e);
    return s + 2.0f * x * (e * s * s) * du_dx;
}

static void gelu_forward_body(float *out, const float *x, size_t n)
{
    int nt = n >= PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1;
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++) out[i] = gelu_of(x[i]);
}

void dt_gelu_forward(float *out, const float *x, size_t n)
{
    const uint64_t t0 = dt_prof_begin();
    gelu_forward_body(out, x, n);
    dt_prof_end(DT_PROF_ACTIVATION, t0, 10.0 * (double)n, 8.0 * (double)n);
}

static void gelu_backward_body(float *dx, const float *x, const float *dout, size_t n)
{
    int nt = n >= PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1;
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (size_t i = 0; i < n; i++) dx[i] = dout[i] * gelu_slope(x[i]);
}

void dt_gelu_backward(float *dx, const float *x, const float *dout, size_t n)
{
    const uint64_t t0 = dt_prof_begin();
    gelu_backward_body(dx, x, dout, n);
    dt_prof_end(DT_PROF_ACTIVATION, t0, 20.0 * (double)n, 12.0 * (double)n);
}

/* The bias of the product before GELU added here, in the pass GELU makes
 * anyway, instead of by the product: sgemm can only add a bias by copying
 * it into every row of its output first and then adding its product to
 * that, one more pass over [rows, cols] written and read (on c_fc's
 * [2048, 1536] at one thread, the product with its bias ran 7-10% slower
 * than without). */
static void gelu_bias_forward_body(float *out, const float *x, const float *bias, size_t rows,
                                   size_t cols)
{
    int nt = rows * cols >= PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *o = out + r * cols;
#pragma omp simd
        for (size_t j = 0; j < cols; j++) o[j] = gelu_of(xr[j] + bias[j]);
    }
}

void dt_gelu_bias_forward(float *out, const float *x, const float *bias, size_t rows,
                          size_t cols)
{
    if (!bias) {
        dt_gelu_forward(out, x, rows * cols);
        return;
    }
    const uint64_t t0 = dt_prof_begin();
    gelu_bias_forward_body(out, x, bias, rows, cols);
    const double n = (double)rows * (double)cols;
    dt_prof_end(DT_PROF_ACTIVATION, t0, 11.0 * n, 8.0 * n);
}

static void gelu_bias_backward_body(float *dx, const float *x, const float *bias,
                                    const float *dout, size_t rows, size_t cols)
{
    int nt = rows * cols >= PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols, *d = dout + r * cols;
        float *g = dx + r * cols;
#pragma omp simd
        for (size_t j = 0; j < cols; j++) g[j] = d[j] * gelu_slope(xr[j] + bias[j]);
    }
}

void dt_gelu_bias_backward(float *dx, const float *x, const float *bias, const float *dout,
                           size_t rows, size_t cols)
{
    if (!bias) {
        dt_gelu_backward(dx, x, dout, rows * cols);
        return;
    }
    const uint64_t t0 = dt_prof_begin();
    gelu_bias_backward_body(dx, x, bias, dout, rows, cols);
    const double n = (double)rows * (double)cols;
    dt_prof_end(DT_PROF_ACTIVATION, t0, 21.0 * n, 12.0 * n);
}
