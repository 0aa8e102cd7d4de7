/*
 * dt_linear_forward and dt_linear_backward against double references, in
 * fp32 and bf16 (products on bf16-rounded operands, the bias and its
 * gradient exact; the bias gradient alone at 50257 columns, bit for bit),
 * with and without bias, overwriting and accumulating
 * dinp, and skipping dinp or db. Groups of Linear-layout weights that
 * share their input (q, k and v), stored one after another (one product)
 * and apart (one each), against the same references. The bias and
 * residual added after a product, bit for bit against (x + b) + res.
 */
#include "bf16_ref.h"
#include "kernel_test.h"
#include "kernels/linear.h"
#include "kernels/threads.h"

static float *rounded(const float *x, size_t n, int bf16)
{
    float *y = fcopy(x, n);
    for (size_t i = 0; bf16 && i < n; i++) y[i] = ref_bf16_round(x[i]);
    return y;
}

static void check_forward(dt_precision prec, int N, int IN, int OUT, int with_bias)
{
    int bf16 = prec == DT_PREC_BF16;
    float *inp = rnd_array((size_t)N * IN, 1.0f), *W = rnd_array((size_t)IN * OUT, 1.0f);
    float *b = with_bias ? rnd_array(OUT, 1.0f) : NULL;
    float *out = rnd_array((size_t)N * OUT, 1.0f);
    float *ri = rounded(inp, (size_t)N * IN, bf16), *rW = rounded(W, (size_t)IN * OUT, bf16);
    double *want = dalloc((size_t)N * OUT);
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OUT; o++) {
            double s = b ? b[o] : 0.0;
            for (int k = 0; k < IN; k++) s += (double)ri[(size_t)i * IN + k] * rW[(size_t)k * OUT + o];
            want[(size_t)i * OUT + o] = s;
        }
    CHECK(dt_linear_forward(prec, out, inp, W, b, N, IN, OUT) == 0, "forward failed");
    CHECK_CLOSE(out, want, (size_t)N * OUT, 1e-5, "forward %s N=%d IN=%d OUT=%d bias=%d",
                bf16 ? "bf16" : "fp32", N, IN, OUT, with_bias);
    free(inp), free(W), free(b), free(out), free(ri), free(rW), free(want);
}

typedef struct {
    float *dinp, *dW, *db;
} grads;
static void check_backward(dt_precision prec, int N, int IN, int OUT, int accumulate,
                           int with_dinp, int with_db)
{
    int bf16 = prec == DT_PREC_BF16;
    float *inp = rnd_array((size_t)N * IN, 1.0f), *W = rnd_array((size_t)IN * OUT, 1.0f);
    float *dout = rnd_array((size_t)N * OUT, 1.0f);
    grads g = {rnd_array((size_t)N * IN, 1.0f), rnd_array((size_t)IN * OUT, 1.0f),
               rnd_array(OUT, 1.0f)};
    if (!accumulate)
        for (size_t i = 0; i < (size_t)N * IN; i++) g.dinp[i] = NAN; /* must be overwritten */
    grads before = {fcopy(g.dinp, (size_t)N * IN), fcopy(g.dW, (size_t)IN * OUT),
                    fcopy(g.db, OUT)};
    float *ri = rounded(inp, (size_t)N * IN, bf16), *rW = rounded(W, (size_t)IN * OUT, bf16);
    float *rd = rounded(dout, (size_t)N * OUT, bf16);
    double *want_dinp = dalloc((size_t)N * IN), *want_dW = dalloc((size_t)IN * OUT);
    double *want_db = dalloc(OUT);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < IN; k++) {
            double s = accumulate ? before.dinp[(size_t)i * IN + k] : 0.0;
            for (int o = 0; o < OUT; o++) s += (double)rd[(size_t)i * OUT + o] * rW[(size_t)k * OUT + o];
            want_dinp[(size_t)i * IN + k] = s;
        }
    for (int k = 0; k < IN; k++)
        for (int o = 0; o < OUT; o++) {
            double s = before.dW[(size_t)k * OUT + o];
            for (int i = 0; i < N; i++) s += (double)ri[(size_t)i * IN + k] * rd[(size_t)i * OUT + o];
            want_dW[(size_t)k * OUT + o] = s;
        }
    for (int o = 0; o < OUT; o++) {
        double s = before.db[o];
        for (int i = 0; i < N; i++) s += dout[(size_t)i * OUT + o];
        want_db[o] = s;
    }
    int rc = dt_linear_backward(prec, with_dinp ? g.dinp : NULL, accumulate, g.dW,
                                with_db ? g.db : NULL, dout, inp, W, N, IN, OUT);
    CHECK(rc == 0, "backward failed");
    const char *p = bf16 ? "bf16" : "fp32";
    if (with_dinp)
        CHECK_CLOSE(g.dinp, want_dinp, (size_t)N * IN, 1e-5, "dinp %s N=%d IN=%d OUT=%d acc=%d", p,
                    N, IN, OUT, accumulate);
    CHECK_CLOSE(g.dW, want_dW, (size_t)IN * OUT, 1e-5, "dW %s N=%d IN=%d OUT=%d", p, N, IN, OUT);
    if (with_db)
        CHECK_CLOSE(g.db, want_db, OUT, 1e-6, "db %s N=%d OUT=%d", p, N, OUT);
    else
        CHECK(bits_equal(g.db, before.db, OUT), "db changed though NULL was passed");
    free(inp), free(W), free(dout), free(ri), free(rW), free(rd);
    free(g.dinp), free(g.dW), free(g.db), free(before.dinp), free(before.dW), free(before.db);
    free(want_dinp), free(want_dW), free(want_db);
}

/* A group of three weights [out[i], IN] (Linear layout), in one block
 * (adjacent) or in allocations of their own, and its gradients likewise. */
static void check_group(dt_precision prec, int N, int IN, const int out[3], int adjacent,
                        int accumulate)
{
    const int bf16 = prec == DT_PREC_BF16, width = out[0] + out[1] + out[2];
    const size_t nw = (size_t)width * IN;
    float *inp = rnd_array((size_t)N * IN, 1.0f), *W = rnd_array(nw, 1.0f);
    float *dW = rnd_array(nw, 1.0f), *dout = rnd_array((size_t)N * width, 1.0f);
    float *y = rnd_array((size_t)N * width, 1.0f), *dinp = rnd_array((size_t)N * IN, 1.0f);
    float *before_dW = fcopy(dW, nw), *before_dinp = fcopy(dinp, (size_t)N * IN);
    dt_linear_group g = {.n = 3};
    for (int i = 0, row = 0; i < 3; row += out[i++]) {
        g.out[i] = out[i];
        const size_t at = (size_t)row * IN, n = (size_t)out[i] * IN;
        g.W[i] = adjacent ? W + at : fcopy(W + at, n);
        g.dW[i] = adjacent ? dW + at : fcopy(dW + at, n);
    }
    float *ri = rounded(inp, (size_t)N * IN, bf16), *rW = rounded(W, nw, bf16);
    float *rd = rounded(dout, (size_t)N * width, bf16);
    double *want_y = dalloc((size_t)N * width), *want_dx = dalloc((size_t)N * IN);
    double *want_dW = dalloc(nw);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < width; o++) {
            double s = 0.0;
            for (int k = 0; k < IN; k++) s += (double)ri[(size_t)n * IN + k] * rW[(size_t)o * IN + k];
            want_y[(size_t)n * width + o] = s;
        }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < IN; k++) {
            double s = accumulate ? before_dinp[(size_t)n * IN + k] : 0.0;
            for (int o = 0; o < width; o++) s += (double)rd[(size_t)n * width + o] * rW[(size_t)o * IN + k];
            want_dx[(size_t)n * IN + k] = s;
        }
    for (int o = 0; o < width; o++)
        for (int k = 0; k < IN; k++) {
            double s = before_dW[(size_t)o * IN + k];
            for (int n = 0; n < N; n++) s += (double)rd[(size_t)n * width + o] * ri[(size_t)n * IN + k];
            want_dW[(size_t)o * IN + k] = s;
        }
    const char *p = bf16 ? "bf16" : "fp32", *how = adjacent ? "adjacent" : "apart";
    CHECK(dt_linear_group_forward(prec, y, inp, &g, N, IN) == 0, "group forward failed");
    CHECK_CLOSE(y, want_y, (size_t)N * width, 1e-5, "group forward %s %s N=%d IN=%d", p, how, N,
                IN);
    CHECK(dt_linear_group_backward(prec, dinp, accumulate, &g, dout, inp, N, IN) == 0,
          "group backward failed");
    CHECK_CLOSE(dinp, want_dx, (size_t)N * IN, 1e-5, "group dinp %s %s N=%d IN=%d acc=%d", p,
                how, N, IN, accumulate);
    for (int i = 0, row = 0; i < 3; row += out[i++]) {
        CHECK_CLOSE(g.dW[i], want_dW + (size_t)row * IN, (size_t)out[i] * IN, 1e-5,
                    "group dW[%d] %s %s N=%d IN=%d", i, p, how, N, IN);
        if (!adjacent) free((float *)g.W[i]), free(g.dW[i]);
    }
    free(inp), free(W), free(dW), free(dout), free(y), free(dinp), free(before_dW);
    free(before_dinp), free(ri), free(rW), free(rd), free(want_y), free(want_dx), free(want_dW);
}

/* db alone at a width users meet (GPT-2's vocabulary, 50257: past one
 * thread's pass of 2048 columns, and uneven against the threads' ranges):
 * each column's sum over the rows in order, in double, rounded once and
 * added, bit for bit at every thread count. */
static void check_bias_sums(int N, int OUT)
{
    float *dout = rnd_array((size_t)N * OUT, 1.0f), *db = rnd_array(OUT, 1.0f);
    float *want = fcopy(db, OUT);
    for (int o = 0; o < OUT; o++) {
        double s = 0;
        for (int i = 0; i < N; i++) s += dout[(size_t)i * OUT + o];
        want[o] += (float)s;
    }
    CHECK(dt_linear_backward(DT_PREC_F32, NULL, 0, NULL, db, dout, NULL, NULL, N, 1, OUT) == 0,
          "db alone failed");
    CHECK(bits_equal(db, want, OUT), "db N=%d OUT=%d at %d threads: not each column's sum in "
          "row order", N, OUT, dt_kernels_threads());
    free(dout), free(db), free(want);
}

static const int shapes[][3] = {{1, 1, 1}, {1, 16, 48}, {7, 5, 3}, {33, 17, 65}, {64, 64, 64},
                                {130, 48, 200}, {257, 100, 71}};

/* (x + b) + res, written out; in place (out = x) too, and without b. */
static void check_bias_residual(size_t rows, size_t cols)
{
    size_t n = rows * cols;
    float *x = rnd_array(n, 3.0f), *b = rnd_array(cols, 1.0f), *res = rnd_array(n, 3.0f);
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        for (size_t i = 0; i < n; i++)
            want[i] = with_bias ? (x[i] + b[i % cols]) + res[i] : x[i] + res[i];
        dt_linear_bias_residual(got, x, with_bias ? b : NULL, res, rows, cols);
        CHECK(bits_equal(got, want, n), "bias + residual [%zu, %zu]%s: not (x + b) + res",
              rows, cols, with_bias ? "" : " without a bias");
        memcpy(got, x, n * sizeof *got);
        dt_linear_bias_residual(got, got, with_bias ? b : NULL, res, rows, cols);
        CHECK(bits_equal(got, want, n), "bias + residual in place [%zu, %zu]", rows, cols);
    }
    free(x), free(b), free(res), free(want), free(got);
}

int main(void)
{
    int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        for (int prec = 0; prec < 2; prec++)
            for (int s = 0; s < n_shapes; s++) {
                int N = shapes[s][0], IN = shapes[s][1], OUT = shapes[s][2];
                check_forward((dt_precision)prec, N, IN, OUT, 1);
                check_forward((dt_precision)prec, N, IN, OUT, 0);
                check_backward((dt_precision)prec, N, IN, OUT, 0, 1, 1);
                check_backward((dt_precision)prec, N, IN, OUT, 1, 1, 1);
                check_backward((dt_precision)prec, N, IN, OUT, 0, 0, 0);
            }
        check_bias_sums(37, 50257);
        check_bias_residual(3, 17);
        check_bias_residual(129, 385); /* past the threaded split */
        check_bias_residual(45, 768);  /* GPT-2 small's width, an odd row count */
        /* Llama's q, k and v at 6 heads and 2 key/value heads of 8, and odd sizes. */
        static const int groups[][5] = {{64, 48, 48, 16, 16}, {37, 20, 13, 7, 5}};
        for (int prec = 0; prec < 2; prec++)
            for (int k = 0; k < 2; k++)
                for (int adjacent = 0; adjacent < 2; adjacent++)
                    check_group((dt_precision)prec, groups[k][0], groups[k][1], groups[k] + 2,
                                adjacent, k);
    }
    return finish("test_linear");
}
