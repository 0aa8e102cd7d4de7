/*
 * Softmax cross-entropy, fused, one row at a time.
 *   logits, dlogits [N, V]; targets, losses [N]
 * loss = logsumexp(row) - row[target]. The gradient (softmax - onehot) is
 * written over dlogits, which may be the logits buffer itself: the target's
 * logit is read first, then the row is turned into exponentials in place,
 * then scaled. A row stays in L1 through its three passes.
 * A target outside [0, V) (an ignored position) gives loss 0 and a zero
 * gradient row.
 */
#include "kernels/crossentropy.h"

#include <math.h>
#include <stddef.h>

#include "kernels/crossentropy_rows.h"
#include "kernels/profile.h"
#include "kernels/threads.h"

static float row_loss(float *d, const float *x, int target, int V, float grad_scale)
{
    if (target < 0 || target >= V) {
        for (int j = 0; d && j < V; j++) d[j] = 0.0f;
        return 0.0f;
    }
    float x_target = x[target];
    float max = dt_ce_row_max(x, V);
    double sum = d ? dt_ce_sum_exp(d, x, max, V) : dt_ce_sum_exp_no_output(x, max, V);
    if (d) {
        float scale = (float)(grad_scale / sum);
#pragma omp simd
        for (int j = 0; j < V; j++) d[j] *= scale;
        d[target] -= grad_scale;
    }
    return (float)((double)max + log(sum) - x_target);
}

static double crossentropy_body(float *dlogits, float *losses, const float *logits,
                                const int32_t *targets, int N, int V, float grad_scale)
{
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int i = 0; i < N; i++) {
        size_t off = (size_t)i * V;
        losses[i] = row_loss(dlogits ? dlogits + off : NULL, logits + off, targets[i], V,
                             grad_scale);
    }
    double total = 0.0;
    for (int i = 0; i < N; i++) total += losses[i];
    return total;
}

double dt_crossentropy(float *dlogits, float *losses, const float *logits,
                       const int32_t *targets, int N, int V, float grad_scale)
{
    const uint64_t t0 = dt_prof_begin();
    const double r = crossentropy_body(dlogits, losses, logits, targets, N, V, grad_scale);
    dt_prof_end(DT_PROF_CROSSENTROPY, t0, 4.0 * (double)N * V,
                4.0 * (2.0 * (double)N * V + 3.0 * N));
    return r;
}
