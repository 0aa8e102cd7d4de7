/*
 * GELU (tanh approximation) against the PyTorch formula evaluated in double,
 * element by element; backward against its derivative in double and against
 * finite differences; in-place backward; special values; sizes that exercise
 * the vector tails and the threaded split. The forms that add a product's
 * bias first: bit for bit the plain kernels on x + bias rounded once, with
 * odd row widths and both thread counts.
 */
#include "kernel_test.h"
#include "kernels/gelu.h"
#include "kernels/threads.h"

static double ref_gelu(double x)
{
    double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + tanh(u));
}

static double ref_gelu_grad(double x)
{
    double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    double du = sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
    double th = tanh(u);
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}

/* Each element within rel_tol of its own reference (plus a floor for
 * results that are themselves near zero). */
static int count_far(const float *got, const double *want, size_t n, double rel_tol, double floor)
{
    int far = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= rel_tol * fabs(want[i]) + floor)) far++;
    return far;
}

static void check_size(size_t n, float range)
{
    float *x = rnd_array(n, range), *out = rnd_array(n, 1.0f), *dout = rnd_array(n, 1.0f);
    float *dx = malloc((n ? n : 1) * sizeof *dx);
    double *want = dalloc(n), *want_dx = dalloc(n);
    for (size_t i = 0; i < n; i++) {
        want[i] = ref_gelu(x[i]);
        want_dx[i] = dout[i] * ref_gelu_grad(x[i]);
    }
    dt_gelu_forward(out, x, n);
    dt_gelu_backward(dx, x, dout, n);
    int far = count_far(out, want, n, 2e-6, 1e-12);
    CHECK(far == 0, "forward n=%zu range %g: %d elements off", n, range, far);
    far = count_far(dx, want_dx, n, 1e-6, 1e-6);
    CHECK(far == 0, "backward n=%zu range %g: %d elements off", n, range, far);
    CHECK_CLOSE(dx, want_dx, n, 1e-6, "backward n=%zu", n);
    dt_gelu_backward(dout, x, dout, n); /* in place: dx aliases dout */
    CHECK(bits_equal(dout, dx, n), "in-place backward differs n=%zu", n);
    free(x), free(out), free(dout), free(dx), free(want), free(want_dx);
}

static void check_finite_differences(void)
{
    enum { n = 2001 };
    float x[n], dout[n], dx[n];
    double want[n];
    for (int i = 0; i < n; i++) {
        x[i] = -8.0f + 16.0f * (float)i / (n - 1);
        dout[i] = 1.0f;
    }
    dt_gelu_backward(dx, x, dout, n);
    for (int i = 0; i < n; i++) {
        const double h = 1e-5;
        want[i] = (ref_gelu((double)x[i] + h) - ref_gelu((double)x[i] - h)) / (2 * h);
    }
    CHECK_CLOSE(dx, want, n, 1e-6, "backward against finite differences");
}

static void check_special_values(void)
{
    float x[6] = {0.0f, 30.0f, -30.0f, INFINITY, NAN, -0.0f}, out[6];
    dt_gelu_forward(out, x, 6);
    CHECK(out[0] == 0.0f, "gelu(0) = %g", out[0]);
    CHECK(out[1] == 30.0f, "gelu(30) = %g", out[1]);
    CHECK(out[2] == 0.0f, "gelu(-30) = %g", out[2]);
    CHECK(isinf(out[3]) && out[3] > 0, "gelu(inf) = %g", out[3]);
    CHECK(isnan(out[4]), "gelu(nan) = %g", out[4]);
    CHECK(out[5] == 0.0f, "gelu(-0) = %g", out[5]);
}

/* gelu(x + bias) and its gradient, bias per column: the plain kernels on
 * the sum written out first, to the bit, and in place; no bias: the plain
 * kernels on x. */
static void check_bias(size_t rows, size_t cols)
{
    size_t n = rows * cols;
    float *x = rnd_array(n, 4.0f), *bias = rnd_array(cols, 2.0f), *dout = rnd_array(n, 1.0f);
    float *sum = malloc(n * sizeof *sum), *want = malloc(n * sizeof *want);
    float *got = malloc(n * sizeof *got), *want_dx = malloc(n * sizeof *want_dx);
    for (size_t i = 0; i < n; i++) sum[i] = x[i] + bias[i % cols];
    dt_gelu_forward(want, sum, n);
    dt_gelu_bias_forward(got, x, bias, rows, cols);
    CHECK(bits_equal(got, want, n), "gelu(x + bias) [%zu, %zu]: not the bits of gelu on the sum",
          rows, cols);
    dt_gelu_backward(want_dx, sum, dout, n);
    dt_gelu_bias_backward(got, x, bias, dout, rows, cols);
    CHECK(bits_equal(got, want_dx, n), "gelu'(x + bias) [%zu, %zu]: not the bits of the plain "
          "backward on the sum", rows, cols);
    dt_gelu_bias_backward(dout, x, bias, dout, rows, cols); /* dx aliases dout */
    CHECK(bits_equal(dout, want_dx, n), "gelu'(x + bias) in place [%zu, %zu]", rows, cols);
    dt_gelu_forward(want, x, n);
    dt_gelu_bias_forward(got, x, NULL, rows, cols);
    CHECK(bits_equal(got, want, n), "gelu(x + no bias) [%zu, %zu]: gelu(x)", rows, cols);
    free(x), free(bias), free(dout), free(sum), free(want), free(got), free(want_dx);
}

int main(void)
{
    static const size_t sizes[] = {0, 1, 15, 16, 17, 1000, (1 << 20) + 3};
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            check_size(sizes[i], 3.0f);
            check_size(sizes[i], 12.0f);
        }
        check_bias(1, 1);
        check_bias(3, 17);
        check_bias(33, 1000);
        check_bias(64, 1537); /* above the threaded split, rows of an odd width */
        check_bias(37, 3072); /* GPT-2 small's c_fc (4 x 768), an odd row count */
    }
    check_finite_differences();
    check_special_values();
    return finish("test_gelu");
}
