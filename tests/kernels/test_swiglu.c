/*
 * SwiGLU's element-wise part against its definition in double: h =
 * silu(gate) * up, and the gradients of gate (dh up s (1 + a (1 - s)), s =
 * sigmoid(a)) and up (dh silu(a)); the flat form, and the row form over a
 * product's [gate | up] rows (odd widths, one and two threads), which
 * must give the flat form's bits.
 */
#include "kernel_test.h"
#include "kernels/swiglu.h"
#include "kernels/threads.h"

static void check_rows(int rows, int F)
{
    const int ld = 2 * F;
    const size_t n = (size_t)rows * F;
    float *gu = rnd_array((size_t)rows * ld, 6.0f), *dh = rnd_array(n, 1.0f);
    float *h = rnd_array(n, 1.0f), *dgu = rnd_array((size_t)rows * ld, 1.0f);
    float *gate = malloc(n * sizeof *gate), *up = malloc(n * sizeof *up);
    float *flat_h = malloc(n * sizeof *flat_h), *dg = malloc(n * sizeof *dg);
    float *du = malloc(n * sizeof *du), *got_dg = malloc(n * sizeof *got_dg);
    float *got_du = malloc(n * sizeof *got_du);
    double *want_h = dalloc(n), *want_dg = dalloc(n), *want_du = dalloc(n);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < F; i++) {
            const size_t k = (size_t)r * F + i;
            const double a = gate[k] = gu[(size_t)r * ld + i], u = up[k] = gu[(size_t)r * ld + F + i];
            const double s = 1.0 / (1.0 + exp(-a));
            want_h[k] = a * s * u;
            want_dg[k] = dh[k] * u * s * (1.0 + a * (1.0 - s));
            want_du[k] = dh[k] * a * s;
        }
    dt_swiglu_forward_rows(h, gu, rows, F, ld);
    dt_swiglu_backward_rows(dgu, dh, gu, rows, F, ld);
    for (int r = 0; r < rows; r++) {
        memcpy(got_dg + (size_t)r * F, dgu + (size_t)r * ld, F * sizeof(float));
        memcpy(got_du + (size_t)r * F, dgu + (size_t)r * ld + F, F * sizeof(float));
    }
    CHECK_CLOSE(h, want_h, n, 2e-6, "forward rows=%d F=%d", rows, F);
    CHECK_CLOSE(got_dg, want_dg, n, 2e-6, "dgate rows=%d F=%d", rows, F);
    CHECK_CLOSE(got_du, want_du, n, 2e-6, "dup rows=%d F=%d", rows, F);
    dt_swiglu_forward(flat_h, gate, up, n);
    dt_swiglu_backward(dg, du, dh, gate, up, n);
    CHECK(bits_equal(h, flat_h, n) && bits_equal(got_dg, dg, n) && bits_equal(got_du, du, n),
          "rows=%d F=%d: the row form differs from the flat form", rows, F);
    free(gu), free(dh), free(h), free(dgu), free(gate), free(up), free(flat_h), free(dg);
    free(du), free(got_dg), free(got_du), free(want_h), free(want_dg), free(want_du);
}

int main(void)
{
    static const int shapes[][2] = {{1, 1}, {3, 17}, {64, 40}, {129, 1024}};
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        for (int s = 0; s < 4; s++) check_rows(shapes[s][0], shapes[s][1]);
    }
    return finish("test_swiglu");
}
