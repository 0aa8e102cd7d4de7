/*
 * The cross-entropy over vocabulary slices, the ranks simulated in one
 * process: the test cuts each row of logits into slices (dt_vocab_slice),
 * runs the local steps on each and combines what the all-reduces would (max
 * over slices, sums added in slice order), then compares the losses, their
 * sum and the concatenated gradient with dt_crossentropy on the whole rows:
 * the same bits with one slice, within 1e-6 with more. Also the slices'
 * own outputs (max, target logit exactly, sum against double), ignored
 * targets (-1 and V), rows of large logits, uneven and empty slices, the
 * gradient in place over the logits or into separate buffers, the loss alone.
 */
#include "kernel_test.h"
#include "kernels/crossentropy.h"
#include "kernels/crossentropy_split.h"
#include "kernels/threads.h"

enum { MAX_SLICES = 8 };

/* rows of small logits and rows of large ones (scale 30), targets mostly
 * valid, some -1 and some V */
static void make_inputs(float *logits, int32_t *targets, int N, int V)
{
    for (int i = 0; i < N; i++) {
        float scale = i % 3 == 1 ? 30.0f : 2.0f;
        for (int j = 0; j < V; j++) logits[(size_t)i * V + j] = rnd_unit() * scale;
        int k = (int)(rnd_u64() % 10);
        targets[i] = k == 0 ? -1 : k == 1 ? V : (int32_t)(rnd_u64() % (uint64_t)V);
    }
}

static double *to_double(const float *x, size_t n)
{
    double *y = dalloc(n);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

/* One slice's local steps against direct computations on its logits:
 * its max, its target logits exactly, its sum of exponentials in double. */
static void check_slice_outputs(const float *x, const float *max, const float *gmax,
                                const double *sum, const double *tl, const int32_t *targets,
                                int N, int Vl, int v0, int V)
{
    for (int i = 0; i < N; i++) {
        const float *row = x + (size_t)i * Vl;
        float m = -INFINITY;
        double s = 0.0;
        for (int j = 0; j < Vl; j++) m = row[j] > m ? row[j] : m;
        int ign = targets[i] < 0 || targets[i] >= V;
        /* the difference rounded to float as the kernel takes it: far below
         * the max, its rounding alone moves exp by more than 1e-6 */
        for (int j = 0; !ign && j < Vl; j++) s += exp((double)(row[j] - gmax[i]));
        int here = !ign && targets[i] >= v0 && targets[i] < v0 + Vl;
        double want_tl = here ? row[targets[i] - v0] : 0.0;
        CHECK(max[i] == m, "row %d slice at %d: max %g, want %g", i, v0, max[i], m);
        CHECK(tl[i] == want_tl, "row %d slice at %d: target logit %g, want %g", i, v0, tl[i],
              want_tl);
        CHECK(fabs(sum[i] - s) <= 1e-6 * s, "row %d slice at %d: sum %.9g, want %.9g", i, v0,
              sum[i], s);
    }
}

/* one simulated rank: its slice of every row and what its steps return */
struct slice {
    int v0, Vl;
    float *x, *e, *max; /* e: the exponentials, x itself when in place */
    double *sum, *tl;
};

static struct slice slice_open(const float *logits, int N, int V, int S, int r)
{
    struct slice s;
    dt_vocab_slice(V, S, r, &s.v0, &s.Vl);
    s.x = malloc(((size_t)N * s.Vl + 1) * sizeof(float));
    for (int i = 0; i < N; i++)
        memcpy(s.x + (size_t)i * s.Vl, logits + (size_t)i * V + s.v0, s.Vl * sizeof(float));
    s.e = NULL, s.max = malloc(N * sizeof(float)), s.sum = dalloc(N), s.tl = dalloc(N);
    return s;
}

static void slice_close(struct slice *s)
{
    if (s->e != s->x) free(s->e);
    free(s->x), free(s->max), free(s->sum), free(s->tl);
}

/* the local sums of one slice, checked against its logits */
static void slice_sums(struct slice *s, const float *gmax, const int32_t *targets, int N, int V,
                       int grad, int in_place)
{
    size_t n = (size_t)N * s->Vl;
    float *copy = fcopy(s->x, n);
    s->e = !grad ? NULL : in_place ? s->x : malloc((n + 1) * sizeof(float));
    dt_crossentropy_split_sums(s->sum, s->tl, s->e, s->x, gmax, targets, N, s->Vl, s->v0, V);
    check_slice_outputs(copy, s->max, gmax, s->sum, s->tl, targets, N, s->Vl, s->v0, V);
    CHECK(s->e == s->x || bits_equal(copy, s->x, n), "logits changed with exps apart");
    free(copy);
}

/* The split steps over S slices; the gradient goes to d [N, V] when d is
 * not NULL (in place over each slice's logits, or through separate exps and
 * dlogits buffers). Returns the loss sum. */
static double run_split(float *d, float *losses, const float *logits, const int32_t *targets,
                        int N, int V, int S, float grad_scale, int in_place)
{
    struct slice sl[MAX_SLICES];
    float *gmax = malloc(N * sizeof *gmax);
    double *gsum = dalloc(N), *gtl = dalloc(N);
    for (int i = 0; i < N; i++) gmax[i] = -INFINITY;
    for (int r = 0; r < S; r++) {
        sl[r] = slice_open(logits, N, V, S, r);
        dt_crossentropy_split_max(sl[r].max, sl[r].x, N, sl[r].Vl);
        for (int i = 0; i < N; i++) gmax[i] = sl[r].max[i] > gmax[i] ? sl[r].max[i] : gmax[i];
    }
    for (int r = 0; r < S; r++) {
        slice_sums(&sl[r], gmax, targets, N, V, d != NULL, in_place);
        for (int i = 0; i < N; i++) gsum[i] += sl[r].sum[i], gtl[i] += sl[r].tl[i];
    }
    double total = dt_crossentropy_split_losses(losses, gmax, gsum, gtl, targets, N, V);
    for (int r = 0; d && r < S; r++) {
        struct slice *s = &sl[r];
        float *dl = in_place ? s->x : malloc(((size_t)N * s->Vl + 1) * sizeof(float));
        dt_crossentropy_split_backward(dl, s->e, gsum, targets, N, s->Vl, s->v0, V, grad_scale);
        for (int i = 0; i < N; i++)
            memcpy(d + (size_t)i * V + s->v0, dl + (size_t)i * s->Vl, s->Vl * sizeof(float));
        if (!in_place) free(dl);
    }
    for (int r = 0; r < S; r++) slice_close(&sl[r]);
    free(gmax), free(gsum), free(gtl);
    return total;
}

static void check_split(int N, int V, int S, float grad_scale, int in_place)
{
    size_t n = (size_t)N * V;
    float *logits = malloc(n * sizeof *logits), *want_d = malloc(n * sizeof *want_d);
    float *d = malloc(n * sizeof *d), *losses = malloc(N * sizeof *losses);
    float *want_losses = malloc(N * sizeof *want_losses), *losses2 = malloc(N * sizeof *losses2);
    int32_t *targets = malloc(N * sizeof *targets);
    make_inputs(logits, targets, N, V);
    for (size_t i = 0; i < n; i++) d[i] = NAN; /* every element must be written */
    double want_sum = dt_crossentropy(want_d, want_losses, logits, targets, N, V, grad_scale);
    double sum = run_split(d, losses, logits, targets, N, V, S, grad_scale, in_place);
    double sum2 = run_split(NULL, losses2, logits, targets, N, V, S, grad_scale, 0);
    if (S == 1) {
        CHECK(bits_equal(losses, want_losses, N) && sum == want_sum,
              "N=%d V=%d one slice: losses differ from dt_crossentropy", N, V);
        CHECK(bits_equal(d, want_d, n), "N=%d V=%d one slice: dlogits differ", N, V);
    }
    double *wl = to_double(want_losses, N), *wd = to_double(want_d, n);
    CHECK_CLOSE(losses, wl, N, 1e-6, "losses N=%d V=%d S=%d", N, V, S);
    CHECK_CLOSE(d, wd, n, 1e-6, "dlogits N=%d V=%d S=%d", N, V, S);
    CHECK(fabs(sum - want_sum) <= 1e-6 * fabs(want_sum), "N=%d V=%d S=%d: sum %.9g, want %.9g",
          N, V, S, sum, want_sum);
    /* the loss alone sums without a buffer, in chunks, like dt_crossentropy */
    float *losses3 = malloc(N * sizeof *losses3);
    double sum3 = dt_crossentropy(NULL, losses3, logits, targets, N, V, grad_scale);
    if (S == 1)
        CHECK(bits_equal(losses2, losses3, N) && sum2 == sum3, "N=%d V=%d one slice, no gradient",
              N, V);
    CHECK_CLOSE(losses2, wl, N, 1e-6, "losses without gradient N=%d V=%d S=%d", N, V, S);
    for (int i = 0; i < N; i++) {
        if (targets[i] >= 0 && targets[i] < V) continue;
        int bad = losses[i] != 0.0f || losses2[i] != 0.0f;
        for (int j = 0; j < V; j++) bad |= d[(size_t)i * V + j] != 0.0f;
        CHECK(!bad, "N=%d V=%d S=%d: ignored row %d (target %d) contributed", N, V, S, i,
              targets[i]);
    }
    free(logits), free(want_d), free(d), free(losses), free(want_losses), free(losses2);
    free(losses3), free(targets), free(wl), free(wd);
}

/* V, N, the last slice's size */
static void check_slices(void)
{
    int v0, Vl, want[][3] = {{67, 1, 67}, {67, 4, 16}, {67, 3, 21}, {67, 2, 33},
                             {64, 4, 16}, {10, 4, 1}, {9, 4, 0},   {3, 4, 0}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        int V = want[k][0], S = want[k][1], end = 0;
        for (int r = 0; r < S; r++) {
            dt_vocab_slice(V, S, r, &v0, &Vl);
            CHECK(v0 == end && Vl >= 0, "V=%d S=%d slice %d at %d, want %d", V, S, r, v0, end);
            end = v0 + Vl;
        }
        CHECK(end == V && Vl == want[k][2], "V=%d S=%d: ends at %d, last %d", V, S, end, Vl);
    }
}

int main(void)
{
    check_slices();
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        for (int S = 1; S <= 4; S++) {
            check_split(41, 67, S, 1.0f, 1);
            check_split(41, 67, S, 0.25f, 0);
        }
        check_split(23, 9, 4, 1.0f, 1); /* the last slice empty */
        check_split(5, 3, 4, 0.5f, 0);  /* one entry a slice, the last empty */
        check_split(3, 1000, 3, 1.0f, 1);
        check_split(2, 50257, 1, 1.0f, 1);
        check_split(2, 50257, 4, 1.0f / 2, 0);
    }
    return finish("test_crossentropy_split");
}
