/*
 * RMSNorm over the last dimension.
 *   x, out, dout, dx [N, C]; w, dw [C]; rstd [N]
 * Rows are independent and split across threads. The weight's gradient
 * sums over rows: each thread sums its own contiguous range of rows into
 * private partials (double, on its stack), added in thread order, so a
 * given thread count always gives the same bits (as layernorm.c).
 */
#include "kernels/rmsnorm.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/profile.h"
#include "kernels/threads.h"

static float row_rstd(const float *x, float eps, int C)
{
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int i = 0; i < C; i++) sq += x[i] * x[i];
    return 1.0f / sqrtf(sq / (float)C + eps);
}

static void rmsnorm_forward_body(float *out, float *rstd, const float *x, const float *w, float eps,
                                 int N, int C)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int r = 0; r < N; r++) {
        const size_t off = (size_t)r * C;
        const float s = row_rstd(x + off, eps, C);
#pragma omp simd
        for (int i = 0; i < C; i++) out[off + i] = x[off + i] * s * w[i];
        rstd[r] = s;
    }
}

void dt_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, float eps,
                        int N, int C)
{
    const uint64_t t0 = dt_prof_begin();
    rmsnorm_forward_body(out, rstd, x, w, eps, N, C);
    dt_prof_end(DT_PROF_NORM, t0, 4.0 * (double)N * C, 4.0 * (2.0 * (double)N * C + N + C));
}

/* One row of the input gradient, plus its terms of dw. With xhat = x rstd
 * and g = w dout: dx = rstd (g - xhat mean(g xhat)). */
static void backward_row(float *dx, double *dw_part, const float *dout, const float *x,
                         const float *w, float rstd, int C)
{
    float g_xhat_sum = 0.0f;
#pragma omp simd reduction(+ : g_xhat_sum)
    for (int i = 0; i < C; i++) g_xhat_sum += w[i] * dout[i] * (x[i] * rstd);
    const float g_xhat_mean = g_xhat_sum / (float)C;
#pragma omp simd
    for (int i = 0; i < C; i++) {
        const float xhat = x[i] * rstd;
        dx[i] += rstd * (w[i] * dout[i] - xhat * g_xhat_mean);
        dw_part[i] += (double)(dout[i] * xhat);
    }
}

static void rmsnorm_backward_body(float *dx, float *dw, const float *dout, const float *x,
                                  const float *w, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0) return;
    int nt = dt_kernels_threads();
    double *partials[nt]; /* per thread: its rows' dw terms [C], on that thread's stack */
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), team = omp_get_num_threads();
        int lo = (int)((long long)N * t / team), hi = (int)((long long)N * (t + 1) / team);
        double part[(size_t)C];
        memset(part, 0, sizeof part);
        for (int r = lo; r < hi; r++) {
            const size_t off = (size_t)r * C;
            backward_row(dx + off, part, dout + off, x + off, w, rstd[r], C);
        }
        partials[t] = part;
#pragma omp barrier
#pragma omp for schedule(static)
        for (int i = 0; i < C; i++) {
            double sum = 0.0;
            for (int k = 0; k < team; k++) sum += partials[k][i];
            dw[i] += (float)sum;
        }
    } /* the loop's closing barrier keeps every part alive until all are summed */
}

void dt_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                         const float *w, const float *rstd, int N, int C)
{
    const uint64_t t0 = dt_prof_begin();
    rmsnorm_backward_body(dx, dw, dout, x, w, rstd, N, C);
    dt_prof_end(DT_PROF_NORM, t0, 8.0 * (double)N * C, 4.0 * (4.0 * (double)N * C + N + 3.0 * C));
}
