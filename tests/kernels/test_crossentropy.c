/*
 * Fused softmax cross-entropy against a double reference: losses, their
 * sum, the gradient (softmax - onehot) * grad_scale, in place over the
 * logits and without a gradient; large logits (the maximum must be taken
 * out); V = 1; targets outside [0, V); the gradient against finite
 * differences of the loss.
 */
#include "kernel_test.h"
#include "kernels/crossentropy.h"
#include "kernels/threads.h"

/* loss of one row in double; the softmax goes to p when it is not NULL */
static double ref_row(const float *x, int target, int V, double *p)
{
    double max = -INFINITY, sum = 0.0;
    for (int j = 0; j < V; j++) max = x[j] > max ? x[j] : max;
    for (int j = 0; j < V; j++) sum += exp((double)x[j] - max);
    for (int j = 0; p && j < V; j++) p[j] = exp((double)x[j] - max) / sum;
    return max + log(sum) - x[target];
}

static void check_shape(int N, int V, float range, float grad_scale)
{
    size_t n = (size_t)N * V;
    float *logits = rnd_array(n, range), *d = malloc(n * sizeof *d), *losses = malloc(N * sizeof *losses);
    int32_t *targets = malloc(N * sizeof *targets);
    double *want_loss = dalloc(N), *want_d = dalloc(n), want_sum = 0.0;
    for (int i = 0; i < N; i++) {
        targets[i] = (int32_t)(rnd_u64() % (uint64_t)V);
        want_loss[i] = ref_row(logits + (size_t)i * V, targets[i], V, want_d + (size_t)i * V);
        want_sum += want_loss[i];
        for (int j = 0; j < V; j++) want_d[(size_t)i * V + j] *= grad_scale;
        want_d[(size_t)i * V + targets[i]] -= grad_scale;
    }
    for (size_t i = 0; i < n; i++) d[i] = NAN; /* overwritten */
    double sum = dt_crossentropy(d, losses, logits, targets, N, V, grad_scale);
    CHECK_CLOSE(losses, want_loss, N, 1e-6, "losses N=%d V=%d range %g", N, V, range);
    CHECK(fabs(sum - want_sum) <= 1e-6 * fabs(want_sum) + 1e-6, "sum %.9g, want %.9g", sum, want_sum);
    CHECK_CLOSE(d, want_d, n, 1e-6, "dlogits N=%d V=%d", N, V);
    /* in place, and without a gradient */
    float *inplace = fcopy(logits, n), *losses2 = malloc(N * sizeof *losses2);
    double sum2 = dt_crossentropy(inplace, losses2, inplace, targets, N, V, grad_scale);
    CHECK(bits_equal(inplace, d, n) && sum2 == sum, "in place differs N=%d V=%d", N, V);
    double sum3 = dt_crossentropy(NULL, losses2, logits, targets, N, V, grad_scale);
    CHECK(bits_equal(losses2, losses, N) && sum3 == sum, "without gradient differs N=%d V=%d", N, V);
    free(logits), free(d), free(losses), free(targets), free(want_loss), free(want_d);
    free(inplace), free(losses2);
}

static void check_ignored_targets(void)
{
    float logits[6] = {1, 2, 3, 4, 5, 6}, d[6], losses[2];
    int32_t targets[2] = {-100, 1};
    double p[3];
    double want = ref_row(logits + 3, 1, 3, p);
    double sum = dt_crossentropy(d, losses, logits, targets, 2, 3, 1.0f);
    CHECK(losses[0] == 0.0f && d[0] == 0.0f && d[1] == 0.0f && d[2] == 0.0f,
          "an ignored target contributed");
    CHECK(fabs(sum - want) < 1e-6, "sum with an ignored target %g, want %g", sum, want);
}

static void check_finite_differences(void)
{
    enum { V = 11 };
    float x[V], d[V], loss;
    double want[V];
    int32_t target = 4;
    for (int j = 0; j < V; j++) x[j] = rnd_unit() * 3.0f;
    dt_crossentropy(d, &loss, x, &target, 1, V, 1.0f);
    for (int j = 0; j < V; j++) {
        const float h = 1e-2f;
        float up[V], down[V];
        memcpy(up, x, sizeof up), memcpy(down, x, sizeof down);
        up[j] += h, down[j] -= h;
        /* the loss is smooth: central differences in double, h exact in float */
        want[j] = (ref_row(up, target, V, NULL) - ref_row(down, target, V, NULL)) / (2.0 * h);
    }
    CHECK_CLOSE(d, want, V, 1e-4, "gradient against finite differences");
}

int main(void)
{
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        check_shape(1, 1, 1.0f, 1.0f);
        check_shape(1, 7, 1.0f, 1.0f);
        check_shape(5, 256, 4.0f, 0.25f);
        check_shape(2048, 256, 8.0f, 1.0f / 2048);
        check_shape(3, 1000, 80.0f, 1.0f); /* exp would overflow without the max */
        check_shape(2, 50257, 10.0f, 1.0f);
    }
    check_ignored_targets();
    check_finite_differences();
    return finish("test_crossentropy");
}
