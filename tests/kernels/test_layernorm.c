/*
 * LayerNorm forward against a double reference; backward against the
 * finite differences of a double forward (small shapes) and against the
 * closed form in double (larger ones); accumulation into dx, dw, db;
 * identical bits on repeated calls.
 */
#include "kernel_test.h"
#include "kernels/layernorm.h"
#include "kernels/threads.h"

#define EPS 1e-5f

/* out = LayerNorm(x) in double, for one row */
static void ref_row(double *out, double *mean_out, double *rstd_out, const double *x,
                    const float *w, const float *b, int C)
{
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < C; i++) mean += x[i];
    mean /= C;
    for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
    double rstd = 1.0 / sqrt(var / C + EPS);
    for (int i = 0; i < C; i++) out[i] = (x[i] - mean) * rstd * w[i] + b[i];
    if (mean_out) *mean_out = mean, *rstd_out = rstd;
}

static void check_forward(int N, int C)
{
    float *x = rnd_array((size_t)N * C, 2.0f), *w = rnd_array(C, 1.0f), *b = rnd_array(C, 1.0f);
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] += 0.5f; /* a mean away from zero */
    float *out = rnd_array((size_t)N * C, 1.0f), *mean = rnd_array(N, 1.0f), *rstd = rnd_array(N, 1.0f);
    double *want = dalloc((size_t)N * C), *want_mean = dalloc(N), *want_rstd = dalloc(N);
    double *row = dalloc(C);
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < C; i++) row[i] = x[(size_t)r * C + i];
        ref_row(want + (size_t)r * C, &want_mean[r], &want_rstd[r], row, w, b, C);
    }
    dt_layernorm_forward(out, mean, rstd, x, w, b, EPS, N, C);
    CHECK_CLOSE(out, want, (size_t)N * C, 1e-5, "forward out N=%d C=%d", N, C);
    CHECK_CLOSE(mean, want_mean, N, 1e-5, "forward mean N=%d C=%d", N, C);
    CHECK_CLOSE(rstd, want_rstd, N, 1e-5, "forward rstd N=%d C=%d", N, C);
    free(x), free(w), free(b), free(out), free(mean), free(rstd);
    free(want), free(want_mean), free(want_rstd), free(row);
}

typedef struct {
    int N, C;
    float *x, *w, *b, *dout;
} problem;

/* loss = sum(LayerNorm(x) * dout) in double, with one input perturbed:
 * which 0 = x, 1 = w, 2 = b; index, by h */
static double loss_at(const problem *p, int which, size_t index, double h)
{
    double *row = dalloc(p->C), *out = dalloc(p->C), total = 0.0;
    float *w = fcopy(p->w, p->C), *b = fcopy(p->b, p->C);
    for (int r = 0; r < p->N; r++) {
        for (int i = 0; i < p->C; i++) row[i] = p->x[(size_t)r * p->C + i];
        if (which == 0 && index / p->C == (size_t)r) row[index % p->C] += h;
        ref_row(out, NULL, NULL, row, w, b, p->C);
        /* w and b perturbations are linear in out: add them exactly */
        for (int i = 0; i < p->C; i++) {
            double o = out[i];
            if (which == 1 && (size_t)i == index) o += h * (o - b[i]) / w[i];
            if (which == 2 && (size_t)i == index) o += h;
            total += o * p->dout[(size_t)r * p->C + i];
        }
    }
    free(row), free(out), free(w), free(b);
    return total;
}

static double central_difference(const problem *p, int which, size_t index)
{
    const double h = 1e-4;
    return (loss_at(p, which, index, h) - loss_at(p, which, index, -h)) / (2 * h);
}

/* Gradients from the kernel, added onto the given starting values. */
static void kernel_grads(const problem *p, float *dx, float *dw, float *db)
{
    float *out = malloc((size_t)p->N * p->C * sizeof *out);
    float *mean = malloc((size_t)p->N * sizeof *mean), *rstd = malloc((size_t)p->N * sizeof *rstd);
    dt_layernorm_forward(out, mean, rstd, p->x, p->w, p->b, EPS, p->N, p->C);
    dt_layernorm_backward(dx, dw, db, p->dout, p->x, p->w, mean, rstd, p->N, p->C);
    free(out), free(mean), free(rstd);
}

static problem make_problem(int N, int C)
{
    problem p = {N, C, rnd_array((size_t)N * C, 2.0f), rnd_array(C, 1.0f), rnd_array(C, 1.0f),
                 rnd_array((size_t)N * C, 1.0f)};
    for (int i = 0; i < C; i++) p.w[i] += p.w[i] >= 0 ? 0.2f : -0.2f; /* no weight near 0 */
    return p;
}

static void free_problem(problem *p) { free(p->x), free(p->w), free(p->b), free(p->dout); }

/* Small shapes: every gradient element against finite differences. The
 * kernel adds to dx, dw and db, which start from random values here. */
static void check_backward_fd(int N, int C)
{
    problem p = make_problem(N, C);
    size_t nx = (size_t)N * C;
    float *dx = rnd_array(nx, 1.0f), *dw = rnd_array(C, 1.0f), *db = rnd_array(C, 1.0f);
    double *want_dx = dalloc(nx), *want_dw = dalloc(C), *want_db = dalloc(C);
    for (size_t i = 0; i < nx; i++) want_dx[i] = dx[i] + central_difference(&p, 0, i);
    for (int i = 0; i < C; i++) {
        want_dw[i] = dw[i] + central_difference(&p, 1, (size_t)i);
        want_db[i] = db[i] + central_difference(&p, 2, (size_t)i);
    }
    kernel_grads(&p, dx, dw, db);
    CHECK_CLOSE(dx, want_dx, nx, 2e-5, "dx (finite differences) N=%d C=%d", N, C);
    CHECK_CLOSE(dw, want_dw, C, 2e-5, "dw (finite differences) N=%d C=%d", N, C);
    CHECK_CLOSE(db, want_db, C, 2e-5, "db (finite differences) N=%d C=%d", N, C);
    free_problem(&p);
    free(dx), free(dw), free(db), free(want_dx), free(want_dw), free(want_db);
}

/* Larger shapes: the closed form, in double. */
static void check_backward_closed_form(int N, int C)
{
    problem p = make_problem(N, C);
    size_t nx = (size_t)N * C;
    float *dx = calloc(nx, sizeof *dx), *dw = calloc(C, sizeof *dw), *db = calloc(C, sizeof *db);
    double *want_dx = dalloc(nx), *want_dw = dalloc(C), *want_db = dalloc(C);
    double *xhat = dalloc(C), *g = dalloc(C);
    for (int r = 0; r < N; r++) {
        const float *x = p.x + (size_t)r * C, *d = p.dout + (size_t)r * C;
        double mean = 0, var = 0, g_mean = 0, gx_mean = 0;
        for (int i = 0; i < C; i++) mean += x[i];
        mean /= C;
        for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
        double rstd = 1.0 / sqrt(var / C + EPS);
        for (int i = 0; i < C; i++) {
            xhat[i] = (x[i] - mean) * rstd;
            g[i] = (double)p.w[i] * d[i];
            g_mean += g[i] / C;
            gx_mean += g[i] * xhat[i] / C;
            want_dw[i] += d[i] * xhat[i];
            want_db[i] += d[i];
        }
        for (int i = 0; i < C; i++)
            want_dx[(size_t)r * C + i] = rstd * (g[i] - g_mean - xhat[i] * gx_mean);
    }
    kernel_grads(&p, dx, dw, db);
    CHECK_CLOSE(dx, want_dx, nx, 1e-5, "dx N=%d C=%d", N, C);
    CHECK_CLOSE(dw, want_dw, C, 1e-5, "dw N=%d C=%d", N, C);
    CHECK_CLOSE(db, want_db, C, 1e-5, "db N=%d C=%d", N, C);
    /* the same call again: the same bits */
    float *dx2 = calloc(nx, sizeof *dx2), *dw2 = calloc(C, sizeof *dw2), *db2 = calloc(C, sizeof *db2);
    kernel_grads(&p, dx2, dw2, db2);
    CHECK(bits_equal(dx, dx2, nx) && bits_equal(dw, dw2, C) && bits_equal(db, db2, C),
          "repeated backward N=%d C=%d gave different bits", N, C);
    free_problem(&p);
    free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2);
    free(want_dx), free(want_dw), free(want_db), free(xhat), free(g);
}

int main(void)
{
    static const int fd_shapes[][2] = {{1, 1}, {1, 5}, {3, 7}, {2, 16}, {5, 33}};
    static const int shapes[][2] = {{1, 384}, {7, 17}, {64, 64}, {257, 384}, {2048, 384}, {33, 1000}};
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            check_forward(shapes[s][0], shapes[s][1]);
            check_backward_closed_form(shapes[s][0], shapes[s][1]);
        }
        for (size_t s = 0; s < sizeof fd_shapes / sizeof fd_shapes[0]; s++) {
            check_forward(fd_shapes[s][0], fd_shapes[s][1]);
            check_backward_fd(fd_shapes[s][0], fd_shapes[s][1]);
        }
    }
    return finish("test_layernorm");
}
