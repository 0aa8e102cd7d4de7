/*
 * Softmax cross-entropy in steps over a vocabulary slice.
 *   logits, exps, dlogits [N, Vl]; targets, losses, max, sum, target_logit [N]
 * The row loops are crossentropy.c's (crossentropy_rows.h: the max, the
 * exponentials written out then summed in double, whole rows when there is a
 * buffer for them and chunks when not; the scale rounded to float once), so
 * that a single slice reproduces dt_crossentropy bit for bit, with or
 * without a gradient. Only the split of the sum over slices differs.
 * --profile counts the passes over the slice as cross-entropy: the
 * maximum, the exponentials and their sums, the gradient.
 */
#include "kernels/crossentropy_split.h"

#include <math.h>
#include <stddef.h>

#include "kernels/crossentropy_rows.h"
#include "kernels/profile.h"
#include "kernels/threads.h"

void dt_vocab_slice(int V, int N, int r, int *v0, int *Vl)
{
    int per = (V + N - 1) / N;
    int lo = r * per < V ? r * per : V, hi = (r + 1) * per < V ? (r + 1) * per : V;
    *v0 = lo;
    *Vl = hi - lo;
}

/* a global target id counts here only when it lies in [v0, v0 + Vl) */
static int in_slice(int32_t target, int v0, int Vl) { return target >= v0 && target - v0 < Vl; }

static int ignored(int32_t target, int V) { return target < 0 || target >= V; }

void dt_crossentropy_split_max(float *max, const float *logits, int N, int Vl)
{
    const uint64_t t0 = dt_prof_begin();
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int i = 0; i < N; i++) {
        max[i] = dt_ce_row_max(logits + (size_t)i * Vl, Vl);
    }
    dt_prof_end(DT_PROF_CROSSENTROPY, t0, (double)N * Vl, 4.0 * ((double)N * Vl + N));
}

void dt_crossentropy_split_sums(double *sum, double *target_logit, float *exps,
                                const float *logits, const float *max, const int32_t *targets,
                                int N, int Vl, int v0, int V)
{
    const uint64_t t0 = dt_prof_begin();
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * Vl;
        float *e = exps ? exps + (size_t)i * Vl : NULL;
        sum[i] = target_logit[i] = 0.0;
        if (ignored(targets[i], V)) continue; /* split_backward zeroes the row */
        /* read before e, which may be x, is overwritten */
        if (in_slice(targets[i], v0, Vl)) target_logit[i] = x[targets[i] - v0];
        sum[i] = e ? dt_ce_sum_exp(e, x, max[i], Vl) : dt_ce_sum_exp_no_output(x, max[i], Vl);
    }
    dt_prof_end(DT_PROF_CROSSENTROPY, t0, 3.0 * N * Vl, 4.0 * (double)N * Vl * (exps ? 2 : 1));
}

double dt_crossentropy_split_losses(float *losses, const float *max, const double *sum,
                                    const double *target_logit, const int32_t *targets, int N,
                                    int V)
{
    for (int i = 0; i < N; i++)
        losses[i] = ignored(targets[i], V)
                        ? 0.0f
                        : (float)((double)max[i] + log(sum[i]) - target_logit[i]);
    double total = 0.0;
    for (int i = 0; i < N; i++) total += losses[i];
    return total;
}

void dt_crossentropy_split_backward(float *dlogits, const float *exps, const double *sum,
                                    const int32_t *targets, int N, int Vl, int v0, int V,
                                    float grad_scale)
{
    const uint64_t t0 = dt_prof_begin();
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int i = 0; i < N; i++) {
        const float *e = exps + (size_t)i * Vl;
        float *d = dlogits + (size_t)i * Vl;
        if (ignored(targets[i], V)) {
            for (int j = 0; j < Vl; j++) d[j] = 0.0f;
            continue;
        }
        float scale = (float)(grad_scale / sum[i]);
#pragma omp simd
        for (int j = 0; j < Vl; j++) d[j] = e[j] * scale;
        if (in_slice(targets[i], v0, Vl)) d[targets[i] - v0] -= grad_scale;
    }
    dt_prof_end(DT_PROF_CROSSENTROPY, t0, (double)N * Vl, 8.0 * (double)N * Vl);
}
