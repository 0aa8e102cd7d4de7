/*
 * Fused causal attention against a plain double reference that forms the
 * whole T x T probability matrix per head (forward: out and lse; backward:
 * the textbook softmax gradient, not the lse / rowsum shortcuts the kernel
 * uses), and on tiny shapes against finite differences of that forward.
 * Shapes cover T = 1, T around the 64-row block, head sizes below, at and
 * above 64 and not a multiple of 16.
 */
#include "kernel_test.h"
#include "kernels/attention.h"
#include "kernels/threads.h"

typedef struct {
    int B, T, C, NH;
} shape;

/* out, lse and (when dqkv) the gradient for dout, all in double */
static void reference(const shape *s, const double *qkv, const float *dout, double *out,
                      double *lse, double *dqkv)
{
    int T = s->T, C = s->C, HS = C / s->NH;
    double scale = 1.0 / sqrt((double)HS);
    double *P = dalloc((size_t)T * T), *dP = dalloc((size_t)T * T);
    if (dqkv)
        for (size_t i = 0; i < (size_t)s->B * T * 3 * C; i++) dqkv[i] = 0.0;
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->NH; h++) {
            const double *base = qkv + (size_t)b * T * 3 * C + (size_t)h * HS;
#define Q(t, d) base[(size_t)(t) * 3 * C + (d)]
#define K(t, d) base[(size_t)(t) * 3 * C + C + (d)]
#define V(t, d) base[(size_t)(t) * 3 * C + 2 * C + (d)]
            for (int t = 0; t < T; t++) {
                double max = -INFINITY, sum = 0.0;
                for (int j = 0; j <= t; j++) {
                    double dot = 0.0;
                    for (int d = 0; d < HS; d++) dot += Q(t, d) * K(j, d);
                    P[(size_t)t * T + j] = dot * scale;
                    if (dot * scale > max) max = dot * scale;
                }
                for (int j = 0; j <= t; j++) sum += exp(P[(size_t)t * T + j] - max);
                for (int j = 0; j <= t; j++) P[(size_t)t * T + j] = exp(P[(size_t)t * T + j] - max) / sum;
                lse[((size_t)b * s->NH + h) * T + t] = max + log(sum);
                for (int d = 0; d < HS; d++) {
                    double o = 0.0;
                    for (int j = 0; j <= t; j++) o += P[(size_t)t * T + j] * V(j, d);
                    out[((size_t)b * T + t) * C + (size_t)h * HS + d] = o;
                }
            }
            if (!dqkv) continue;
            double *dbase = dqkv + (size_t)b * T * 3 * C + (size_t)h * HS;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * HS;
            for (int t = 0; t < T; t++) {
                double row = 0.0;
                for (int j = 0; j <= t; j++) {
                    double dp = 0.0;
                    for (int d = 0; d < HS; d++) dp += dO[(size_t)t * C + d] * V(j, d);
                    dP[(size_t)t * T + j] = dp;
                    row += P[(size_t)t * T + j] * dp;
                }
                for (int j = 0; j <= t; j++) {
                    double p = P[(size_t)t * T + j], ds = p * (dP[(size_t)t * T + j] - row);
                    for (int d = 0; d < HS; d++) {
                        dbase[(size_t)t * 3 * C + d] += ds * K(j, d) * scale;
                        dbase[(size_t)j * 3 * C + C + d] += ds * Q(t, d) * scale;
                        dbase[(size_t)j * 3 * C + 2 * C + d] += p * dO[(size_t)t * C + d];
                    }
                }
            }
#undef Q
#undef K
#undef V
        }
    free(P), free(dP);
}

static double *to_double(const float *x, size_t n)
{
    double *y = dalloc(n);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

static void check_shape(const shape *s)
{
    size_t n_qkv = (size_t)s->B * s->T * 3 * s->C, n_out = (size_t)s->B * s->T * s->C;
    size_t n_lse = (size_t)s->B * s->NH * s->T;
    float *qkv = rnd_array(n_qkv, 2.0f), *dout = rnd_array(n_out, 1.0f);
    float *out = rnd_array(n_out, 1.0f), *lse = rnd_array(n_lse, 1.0f);
    float *dqkv = malloc(n_qkv * sizeof *dqkv);
    for (size_t i = 0; i < n_qkv; i++) dqkv[i] = NAN; /* must be overwritten */
    double *dq = to_double(qkv, n_qkv), *want_out = dalloc(n_out), *want_lse = dalloc(n_lse);
    double *want_dqkv = dalloc(n_qkv);
    reference(s, dq, dout, want_out, want_lse, want_dqkv);
    dt_attention_forward(out, lse, qkv, s->B, s->T, s->C, s->NH);
    dt_attention_backward(dqkv, dout, qkv, out, lse, s->B, s->T, s->C, s->NH);
    CHECK_CLOSE(out, want_out, n_out, 1e-5, "out B=%d T=%d C=%d NH=%d", s->B, s->T, s->C, s->NH);
    CHECK_CLOSE(lse, want_lse, n_lse, 1e-5, "lse B=%d T=%d C=%d NH=%d", s->B, s->T, s->C, s->NH);
    CHECK_CLOSE(dqkv, want_dqkv, n_qkv, 1e-5, "dqkv B=%d T=%d C=%d NH=%d", s->B, s->T, s->C,
                s->NH);
    float *dqkv2 = malloc(n_qkv * sizeof *dqkv2);
    dt_attention_backward(dqkv2, dout, qkv, out, lse, s->B, s->T, s->C, s->NH);
    CHECK(bits_equal(dqkv, dqkv2, n_qkv), "repeated backward gave different bits T=%d", s->T);
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(dqkv2);
    free(dq), free(want_out), free(want_lse), free(want_dqkv);
}

/* loss = sum(out * dout) of the double forward, for finite differences */
static double loss_of(const shape *s, const double *qkv, const float *dout)
{
    size_t n_out = (size_t)s->B * s->T * s->C;
    double *out = dalloc(n_out), *lse = dalloc((size_t)s->B * s->NH * s->T), total = 0.0;
    reference(s, qkv, dout, out, lse, NULL);
    for (size_t i = 0; i < n_out; i++) total += out[i] * dout[i];
    free(out), free(lse);
    return total;
}

static void check_finite_differences(const shape *s)
{
    size_t n_qkv = (size_t)s->B * s->T * 3 * s->C, n_out = (size_t)s->B * s->T * s->C;
    float *qkv = rnd_array(n_qkv, 2.0f), *dout = rnd_array(n_out, 1.0f);
    float *out = malloc(n_out * sizeof *out), *lse = malloc((size_t)s->B * s->NH * s->T * 4);
    float *dqkv = malloc(n_qkv * sizeof *dqkv);
    double *x = to_double(qkv, n_qkv), *want = dalloc(n_qkv);
    const double h = 1e-5;
    for (size_t i = 0; i < n_qkv; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double up = loss_of(s, x, dout);
        x[i] = keep - h;
        double down = loss_of(s, x, dout);
        x[i] = keep;
        want[i] = (up - down) / (2 * h);
    }
    dt_attention_forward(out, lse, qkv, s->B, s->T, s->C, s->NH);
    dt_attention_backward(dqkv, dout, qkv, out, lse, s->B, s->T, s->C, s->NH);
    CHECK_CLOSE(dqkv, want, n_qkv, 1e-5, "dqkv (finite differences) B=%d T=%d C=%d NH=%d", s->B,
                s->T, s->C, s->NH);
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(x), free(want);
}

int main(void)
{
    static const shape shapes[] = {{1, 1, 64, 1},   {2, 5, 16, 2},    {1, 63, 64, 1},
                                   {1, 64, 128, 2}, {1, 65, 64, 1},   {2, 130, 192, 3},
                                   {1, 256, 384, 6}, {1, 100, 80, 1}, {1, 70, 15, 3},
                                   {1, 200, 256, 2}, {3, 129, 48, 2}};
    static const shape fd_shapes[] = {{1, 1, 4, 1}, {2, 6, 8, 2}, {1, 9, 6, 3}};
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(&shapes[i]);
    }
    for (size_t i = 0; i < sizeof fd_shapes / sizeof fd_shapes[0]; i++)
        check_finite_differences(&fd_shapes[i]);
    return finish("test_attention");
}
