/*
 * AdamW, Adam and SGD against PyTorch 1.13's single-tensor formulas
 * evaluated in double, over several steps (bias corrections change with t),
 * with gradient scaling and weight decay; dt_sum_squares against a double
 * sum, and dt_sum_squares_blocks bit for bit against its documented order
 * written out serially. Parameters are compared as values and, more sharply, as the change
 * each step made.
 */
#include "kernel_test.h"
#include "kernels/optimizer.h"
#include "kernels/threads.h"

typedef struct {
    float lr, beta1, beta2, eps, wd, grad_scale;
} hyper;

typedef enum { ADAMW, ADAM } adam_kind;

/* one step of torch.optim.Adam(W), in double */
static void ref_adam(adam_kind kind, double *p, const float *g, double *m, double *v, size_t n,
                     const hyper *h, int t)
{
    double bc1 = 1.0 - pow(h->beta1, t), bc2 = 1.0 - pow(h->beta2, t);
    for (size_t i = 0; i < n; i++) {
        double gi = (double)g[i] * h->grad_scale;
        if (kind == ADAMW) p[i] *= 1.0 - (double)h->lr * h->wd;
        else gi += (double)h->wd * p[i];
        m[i] = m[i] * h->beta1 + gi * (1.0 - h->beta1);
        v[i] = v[i] * h->beta2 + gi * gi * (1.0 - h->beta2);
        double denom = sqrt(v[i]) / sqrt(bc2) + h->eps;
        p[i] -= (double)h->lr / bc1 * m[i] / denom;
    }
}

static double *widen(const float *x, size_t n)
{
    double *y = dalloc(n);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

/* The change of each parameter must match the reference change within
 * 1e-4 of the largest change, plus the rounding of the parameter itself
 * (the new value is an fp32 rounding of old + change: up to an ulp of p). */
static void check_step(const char *what, int t, const float *p, const float *p_before,
                       const double *want_p, const double *want_before, size_t n)
{
    CHECK_CLOSE(p, want_p, n, 1e-6, "%s step %d parameters n=%zu", what, t, n);
    double max_delta = 0.0;
    for (size_t i = 0; i < n; i++) max_delta = fmax(max_delta, fabs(want_p[i] - want_before[i]));
    int far = 0;
    for (size_t i = 0; i < n; i++) {
        double got = (double)p[i] - p_before[i], want = want_p[i] - want_before[i];
        double ulp = (double)nextafterf(fabsf(p[i]), INFINITY) - fabsf(p[i]);
        if (!(fabs(got - want) <= 1e-4 * max_delta + 1.5 * ulp)) far++;
    }
    CHECK(far == 0, "%s step %d: %d updates off (largest update %.3g)", what, t, far, max_delta);
}

static void check_adam(adam_kind kind, size_t n, const hyper *h)
{
    const char *what = kind == ADAMW ? "adamw" : "adam";
    float *p = rnd_array(n, 1.0f), *m = calloc(n ? n : 1, 4), *v = calloc(n ? n : 1, 4);
    double *rp = widen(p, n), *rm = dalloc(n), *rv = dalloc(n);
    for (int t = 1; t <= 5; t++) {
        float *g = rnd_array(n, 0.1f), *before = fcopy(p, n);
        double *rbefore = widen(before, n);
        for (size_t i = 0; i < n; i++) rbefore[i] = rp[i];
        ref_adam(kind, rp, g, rm, rv, n, h, t);
        if (kind == ADAMW)
            dt_adamw_update(p, g, m, v, n, h->lr, h->beta1, h->beta2, h->eps, h->wd, t, h->grad_scale);
        else
            dt_adam_update(p, g, m, v, n, h->lr, h->beta1, h->beta2, h->eps, h->wd, t, h->grad_scale);
        check_step(what, t, p, before, rp, rbefore, n);
        CHECK_CLOSE(m, rm, n, 1e-6, "%s step %d m", what, t);
        CHECK_CLOSE(v, rv, n, 1e-6, "%s step %d v", what, t);
        for (size_t i = 0; i < n; i++) rp[i] = p[i]; /* follow the kernel's rounding */
        free(g), free(before), free(rbefore);
    }
    free(p), free(m), free(v), free(rp), free(rm), free(rv);
}

static void check_sgd(size_t n, float lr, float momentum, float wd, float grad_scale)
{
    float *p = rnd_array(n, 1.0f), *buf = momentum != 0.0f ? rnd_array(n, 1.0f) : NULL;
    double *rp = widen(p, n), *rbuf = dalloc(n);
    for (int t = 1; t <= 3; t++) {
        float *g = rnd_array(n, 0.1f), *before = fcopy(p, n);
        double *rbefore = widen(before, n);
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * grad_scale + (double)wd * rp[i];
            if (momentum != 0.0f) gi = rbuf[i] = t == 1 ? gi : momentum * rbuf[i] + gi;
            rp[i] -= (double)lr * gi;
        }
        dt_sgd_update(p, g, buf, n, lr, momentum, wd, t, grad_scale);
        check_step("sgd", t, p, before, rp, rbefore, n);
        for (size_t i = 0; i < n; i++) rp[i] = p[i];
        free(g), free(before), free(rbefore);
    }
    free(p), free(buf), free(rp), free(rbuf);
}

static void check_sum_squares(size_t n)
{
    float *g = rnd_array(n, 3.0f);
    double want = 0.0;
    for (size_t i = 0; i < n; i++) want += (double)g[i] * g[i];
    double got = dt_sum_squares(g, n);
    CHECK(fabs(got - want) <= 1e-12 * want, "sum of squares n=%zu: %.17g, want %.17g", n, got, want);
    CHECK(dt_sum_squares(g, n) == got, "sum of squares not repeatable n=%zu", n);
    free(g);
}

/* The order optimizer.h promises for a block: lane k adds the elements
 * at k mod 8 in turn, and the lanes fold in pairs. */
static double ref_block(const float *g, size_t n)
{
    double lane[8] = {0};
    for (size_t i = 0; i < n; i++) lane[i % 8] += (double)g[i] * (double)g[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* Blocks that are whole and a multiple of 8 run side by side in the
 * kernel, the rest one at a time: n and block are chosen so that both
 * kinds, and a group of blocks cut short by the end, occur; from an
 * address one float past the allocation's alignment as well. */
static void check_sum_squares_blocks(size_t n, size_t block, size_t offset)
{
    float *all = rnd_array(n + offset, 2.0f), *g = all + offset;
    size_t nb = (n + block - 1) / block;
    double *got = calloc(nb, sizeof *got);
    dt_sum_squares_blocks(g, n, block, got);
    int same = 1;
    for (size_t b = 0; b < nb && same; b++) {
        size_t len = n - b * block < block ? n - b * block : block;
        double want = ref_block(g + b * block, len);
        same = memcmp(&want, &got[b], sizeof want) == 0;
        CHECK(same, "sum of squares, block %zu of %zu (n=%zu, block=%zu, offset %zu): %.17g, "
              "want %.17g bit for bit", b, nb, n, block, offset, got[b], want);
    }
    free(all), free(got);
}

int main(void)
{
    static const size_t sizes[] = {1, 17, 1000, 100003};
    hyper adamw = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f}, adam = {3e-3f, 0.8f, 0.999f, 1e-6f, 0.01f, 1.0f};
    hyper plain = {1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f};
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            check_adam(ADAMW, sizes[i], &adamw);
            check_adam(ADAMW, sizes[i], &plain);
            check_adam(ADAM, sizes[i], &adam);
            check_sgd(sizes[i], 0.1f, 0.9f, 0.01f, 0.5f);
            check_sgd(sizes[i], 0.1f, 0.0f, 0.0f, 1.0f);
            check_sum_squares(sizes[i]);
        }
    }
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        /* 10 blocks of 1024 and a tail (groups of 4: 4, 4, then 2 + the tail) */
        check_sum_squares_blocks(1024 * 10 + 37, 1024, 0);
        check_sum_squares_blocks(1024 * 10 + 37, 1024, 1);
        check_sum_squares_blocks(1024 * 8, 1024, 0);   /* whole groups only */
        check_sum_squares_blocks(1000 * 9 + 5, 1000, 0); /* block not a multiple of 8 */
        check_sum_squares_blocks(13 * 50, 13, 1);
        check_sum_squares_blocks(5, 1024, 0);            /* one short block */
        check_sum_squares_blocks(300000, 1024, 1);       /* both threads, many groups */
    }
    CHECK(dt_sum_squares(NULL, 0) == 0.0, "empty sum of squares");
    return finish("test_optimizer");
}
