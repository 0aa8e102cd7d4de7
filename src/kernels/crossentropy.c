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

#include "kernels/fast_exp.h"
#include "kernels/threads.h"

static float row_max(const float *x, int V)
{
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < V; j++) m = x[j] > m ? x[j] : m;
    return m;
}

/* sum of exp(x - max), summed in double: vocabularies run to 50k entries,
 * where an fp32 running sum would lose digits. The exponentials go to e;
 * they are summed in a second pass (one loop doing both does not vectorise). */
static double sum_exp(float *e, const float *x, float max, int V)
{
#pragma omp simd
    for (int j = 0; j < V; j++) e[j] = dt_fast_expf(x[j] - max);
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; j++) sum += e[j];
    return sum;
}

#define EXP_CHUNK 256

/* the same sum when there is no gradient row to hold the exponentials */
static double sum_exp_no_output(const float *x, float max, int V)
{
    float e[EXP_CHUNK];
    double sum = 0.0;
    for (int j0 = 0; j0 < V; j0 += EXP_CHUNK)
        sum += sum_exp(e, x + j0, max, V - j0 < EXP_CHUNK ? V - j0 : EXP_CHUNK);
    return sum;
}

static float row_loss(float *d, const float *x, int target, int V, float grad_scale)
{
    if (target < 0 || target >= V) {
        for (int j = 0; d && j < V; j++) d[j] = 0.0f;
        return 0.0f;
    }
    float x_target = x[target];
    float max = row_max(x, V);
    double sum = d ? sum_exp(d, x, max, V) : sum_exp_no_output(x, max, V);
    if (d) {
        float scale = (float)(grad_scale / sum);
#pragma omp simd
        for (int j = 0; j < V; j++) d[j] *= scale;
        d[target] -= grad_scale;
    }
    return (float)((double)max + log(sum) - x_target);
}

double dt_crossentropy(float *dlogits, float *losses, const float *logits,
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
