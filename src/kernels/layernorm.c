/*
 * LayerNorm over the last dimension.
 *   x, out, dout, dx [N, C]; w, b, dw, db [C]; mean, rstd [N]
 * Rows are independent and split across threads. The weight and bias
 * gradients sum over rows: each thread sums its own contiguous range of
 * rows into private partials (double, on its stack), and the partials are
 * added in thread order, so a given thread count always gives the same bits.
 */
#include "kernels/layernorm.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/profile.h"
#include "kernels/threads.h"

static void normalize_row(float *out, float *mean_out, float *rstd_out, const float *x,
                          const float *w, const float *b, float eps, int C)
{
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < C; i++) sum += x[i];
    float mean = sum / (float)C;
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int i = 0; i < C; i++) sq += (x[i] - mean) * (x[i] - mean);
    float rstd = 1.0f / sqrtf(sq / (float)C + eps);
#pragma omp simd
    for (int i = 0; i < C; i++) out[i] = (x[i] - mean) * rstd * w[i] + b[i];
    *mean_out = mean;
    *rstd_out = rstd;
}

static void layernorm_forward_body(float *out, float *mean, float *rstd, const float *x,
                                   const float *w, const float *b, float eps, int N, int C)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < N; r++) {
        size_t off = (size_t)r * C;
        normalize_row(out + off, mean + r, rstd + r, x + off, w, b, eps, C);
    }
}

void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, float eps, int N, int C)
{
    const uint64_t t0 = dt_prof_begin();
    layernorm_forward_body(out, mean, rstd, x, w, b, eps, N, C);
    dt_prof_end(DT_PROF_NORM, t0, 8.0 * (double)N * C,
                4.0 * (2.0 * (double)N * C + 2.0 * N + 2.0 * C));
}

/* One row of the input gradient, plus its terms of dw and db. With
 * xhat = (x - mean) * rstd and g = w * dout:
 * dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
static void backward_row(float *dx, double *dw_part, double *db_part, const float *dout,
                         const float *x, const float *w, float mean, float rstd, int C)
{
    float g_sum = 0.0f, g_xhat_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, g_xhat_sum)
    for (int i = 0; i < C; i++) {
        float xhat = (x[i] - mean) * rstd;
        float g = w[i] * dout[i];
        g_sum += g;
        g_xhat_sum += g * xhat;
    }
    float g_mean = g_sum / (float)C, g_xhat_mean = g_xhat_sum / (float)C;
#pragma omp simd
    for (int i = 0; i < C; i++) {
        float xhat = (x[i] - mean) * rstd;
        float g = w[i] * dout[i];
        dx[i] += rstd * (g - g_mean - xhat * g_xhat_mean);
        dw_part[i] += (double)(dout[i] * xhat);
        db_part[i] += (double)dout[i];
    }
}

static void layernorm_backward_body(float *dx, float *dw, float *db, const float *dout,
                                    const float *x, const float *w, const float *mean,
                                    const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0) return;
    int nt = dt_kernels_threads();
    double *partials[nt]; /* per thread: dw then db terms [2C], on that thread's stack */
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), team = omp_get_num_threads();
        int lo = (int)((long long)N * t / team), hi = (int)((long long)N * (t + 1) / team);
        double part[2 * (size_t)C];
        memset(part, 0, sizeof part);
        for (int r = lo; r < hi; r++) {
            size_t off = (size_t)r * C;
            backward_row(dx + off, part, part + C, dout + off, x + off, w, mean[r], rstd[r], C);
        }
        partials[t] = part;
#pragma omp barrier
#pragma omp for schedule(static)
        for (int i = 0; i < C; i++) {
            double dw_sum = 0.0, db_sum = 0.0;
            for (int k = 0; k < team; k++) {
                dw_sum += partials[k][i];
                db_sum += partials[k][C + i];
            }
            dw[i] += (float)dw_sum;
            db[i] += (float)db_sum;
        }
    } /* the loop's closing barrier keeps every part alive until all are summed */
}

void dt_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                           const float *w, const float *mean, const float *rstd, int N, int C)
{
    const uint64_t t0 = dt_prof_begin();
    layernorm_backward_body(dx, dw, db, dout, x, w, mean, rstd, N, C);
    dt_prof_end(DT_PROF_NORM, t0, 12.0 * (double)N * C,
                4.0 * (4.0 * (double)N * C + 2.0 * N + 5.0 * C));
}
