/*
 * Linear layer, its weight in Conv1D [IN, OUT] or Linear [OUT, IN] layout.
 *   inp [N, IN], b [OUT], out/dout [N, OUT], dinp [N, IN]
 * Forward is one product with the bias fused in (or, for a product that
 * joins the residual stream, added with the residual in one pass after
 * it). Backward is two products
 * (dinp = dout @ W^T, dW += inp^T @ dout) and the bias gradient, a column
 * sum of dout; in bf16 the two products share one rounded copy of dout,
 * made in the pass that sums the bias gradient.
 */
#include "kernels/linear.h"

#include <stddef.h>
#include <stdint.h>

#include "core/half.h"
#include "kernels/matmul_problem.h"
#include "kernels/profile.h"
#include "kernels/threads.h"

/* out [N, ldo]'s first OUT columns = inp @ op(W) + b. */
static int forward_ld(dt_precision prec, dt_wlayout lay, float *out, int ldo, const float *inp,
                      const float *W, const float *b, int N, int IN, int OUT)
{
    const int t = lay == DT_LINEAR;
    dt_matmul_problem p = {.prec = prec, .transB = t, .M = N, .N = OUT, .K = IN, .alpha = 1.0f,
                           .beta = 0.0f, .A = inp, .B = W, .lda = IN, .ldb = t ? IN : OUT,
                           .ldc = ldo, .bias = b, .C = out};
    return dt_matmul_solve(&p);
}

int dt_linear_forward_l(dt_precision prec, dt_wlayout lay, float *out, const float *inp,
                        const float *W, const float *b, int N, int IN, int OUT)
{
    return forward_ld(prec, lay, out, OUT, inp, W, b, N, IN, OUT);
}

int dt_linear_forward(dt_precision prec, float *out, const float *inp, const float *W,
                      const float *b, int N, int IN, int OUT)
{
    return dt_linear_forward_l(prec, DT_CONV1D, out, inp, W, b, N, IN, OUT);
}

/* The two products of backward, each operand given in fp32 (A, B; dout
 * [N, ldo]) or rounded once to bf16 (dout16, packed):
 *   dinp = dout @ W^T (Conv1D) or dout @ W (Linear), or +=
 *   dW += inp^T @ dout (Conv1D) or dout^T @ inp (Linear) */
static int backward_products(dt_precision prec, dt_wlayout lay, float *dinp, int dinp_accumulate,
                             float *dW, const float *dout, int ldo, const uint16_t *dout16,
                             const float *inp, const float *W, int N, int IN, int OUT)
{
    const int t = lay == DT_LINEAR, ld = dout16 ? OUT : ldo;
    const float *d = dout16 ? NULL : dout;
    dt_matmul_problem dx = {.prec = prec, .transB = !t, .M = N, .N = IN, .K = OUT,
                            .alpha = 1.0f, .beta = dinp_accumulate ? 1.0f : 0.0f, .A = d,
                            .A16 = dout16, .B = W, .lda = ld, .ldb = t ? IN : OUT, .ldc = IN,
                            .C = dinp};
    dt_matmul_problem conv = {.prec = prec, .transA = 1, .M = IN, .N = OUT, .K = N,
                              .alpha = 1.0f, .beta = 1.0f, .A = inp, .B = d, .B16 = dout16,
                              .lda = IN, .ldb = ld, .ldc = OUT, .C = dW};
    dt_matmul_problem lin = {.prec = prec, .transA = 1, .M = OUT, .N = IN, .K = N,
                             .alpha = 1.0f, .beta = 1.0f, .A = d, .A16 = dout16, .B = inp,
                             .lda = ld, .ldb = IN, .ldc = IN, .C = dW};
    if (dinp && dt_matmul_solve(&dx)) return -1;
    return dW ? dt_matmul_solve(t ? &lin : &conv) : 0;
}

/* Below this many elements one thread adds them (as PASS_PARALLEL_MIN_ELEMS
 * in matmul.c: a team costs more than it saves). */
#define RESIDUAL_PARALLEL_MIN_ELEMS (1 << 15)

void dt_linear_bias_residual(float *out, const float *x, const float *b, const float *res,
                             size_t rows, size_t cols)
{
    int nt = rows * cols >= RESIDUAL_PARALLEL_MIN_ELEMS ? dt_kernels_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols, *rr = res + r * cols;
        float *o = out + r * cols;
        if (b) {
#pragma omp simd
            for (size_t j = 0; j < cols; j++) o[j] = (xr[j] + b[j]) + rr[j];
        } else {
#pragma omp simd
            for (size_t j = 0; j < cols; j++) o[j] = xr[j] + rr[j];
        }
    }
}

/* Columns a thread sums in one pass over the rows (16 KiB of double
 * sums, which stay in L1 while the rows stream by). */
#define SUM_SPAN 2048

/* db += column sums of dout, and with dout16 dout rounded to bf16 into it
 * (packed, OUT apart) in the same pass: in bf16 the products read that
 * copy, and one read of dout serves both (rounding apart, then summing,
 * read it twice: 22 ms of a 506 ms step of the bench model at one thread).
 * Each column is summed over all rows in row order, in double, by one
 * thread: the result does not depend on the thread count, and no thread
 * writes another's columns. A thread takes a contiguous range of columns
 * and reads each row's part of it at once: blocks of 64 columns read row
 * by row took 1.3 ms for [2048, 1536] against 0.8 this way (a 256-byte
 * piece of each row per block, a page apart). */
static void column_sums(float *db, uint16_t *dout16, const float *dout, int ldo, int N, int OUT)
{
    const uint64_t t0 = dt_prof_begin();
    int nt = dt_kernels_threads();
    int per = (OUT + nt - 1) / nt;
    per = (per + 31) / 32 * 32; /* whole cache lines of dout and of dout16 a thread */
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        int end = (t + 1) * per < OUT ? (t + 1) * per : OUT;
        for (int c0 = t * per; c0 < end; c0 += SUM_SPAN) {
            int width = end - c0 < SUM_SPAN ? end - c0 : SUM_SPAN;
            double acc[SUM_SPAN] = {0};
            for (int i = 0; i < N; i++) {
                const float *row = dout + (size_t)i * ldo + c0;
                if (dout16) {
                    uint16_t *out = dout16 + (size_t)i * OUT + c0;
#pragma omp simd
                    for (int j = 0; j < width; j++) {
                        acc[j] += row[j];
                        out[j] = dt_f32_to_bf16(row[j]);
                    }
                } else {
#pragma omp simd
                    for (int j = 0; j < width; j++) acc[j] += row[j];
                }
            }
            for (int j = 0; j < width; j++) db[c0 + j] += (float)acc[j];
        }
    }
    dt_prof_end(DT_PROF_BIAS_GRAD, t0, (double)N * OUT,
                (dout16 ? 6.0 : 4.0) * N * OUT + 8.0 * OUT);
}

/* dt_linear_backward_l with dout [N, ldo]'s first OUT columns. */
static int backward_ld(dt_precision prec, dt_wlayout lay, float *dinp, int dinp_accumulate,
                       float *dW, float *db, const float *dout, int ldo, const float *inp,
                       const float *W, int N, int IN, int OUT)
{
    /* bf16: dout feeds both products, so it is rounded once, here (when
     * no memory is left for the copy, each product rounds its own: the
     * same values). */
    uint16_t *dout16 = NULL;
    if (prec == DT_PREC_BF16 && (dout16 = dt_matmul_bf16_buffer((size_t)N * OUT))) {
        if (db)
            column_sums(db, dout16, dout, ldo, N, OUT);
        else
            dt_matmul_round_bf16(dout16, dout, N, OUT, ldo);
    } else if (db) {
        column_sums(db, NULL, dout, ldo, N, OUT);
    }
    return backward_products(prec, lay, dinp, dinp_accumulate, dW, dout, ldo, dout16, inp, W,
                             N, IN, OUT);
}

int dt_linear_backward_l(dt_precision prec, dt_wlayout lay, float *dinp, int dinp_accumulate,
                         float *dW, float *db, const float *dout, const float *inp,
                         const float *W, int N, int IN, int OUT)
{
    return backward_ld(prec, lay, dinp, dinp_accumulate, dW, db, dout, OUT, inp, W, N, IN, OUT);
}

int dt_linear_backward(dt_precision prec, float *dinp, int dinp_accumulate, float *dW, float *db,
                       const float *dout, const float *inp, const float *W, int N, int IN,
                       int OUT)
{
    return dt_linear_backward_l(prec, DT_CONV1D, dinp, dinp_accumulate, dW, db, dout, inp, W,
                                N, IN, OUT);
}

/* ---- products that share their input ------------------------------------- */

/* The group's width, and whether the n arrays p[i] of out[i] x IN floats
 * lie one after another (as one [sum out, IN] matrix). */
int dt_linear_group_width(const dt_linear_group *g)
{
    int w = 0;
    for (int i = 0; i < g->n; i++) w += g->out[i];
    return w;
}

static int adjacent(const float *const *p, const dt_linear_group *g, int IN)
{
    for (int i = 0; i + 1 < g->n; i++)
        if (p[i] + (size_t)g->out[i] * IN != p[i + 1]) return 0;
    return 1;
}

int dt_linear_group_forward(dt_precision prec, float *out, const float *inp,
                            const dt_linear_group *g, int N, int IN)
{
    const int width = dt_linear_group_width(g);
    if (adjacent(g->W, g, IN))
        return forward_ld(prec, DT_LINEAR, out, width, inp, g->W[0], NULL, N, IN, width);
    for (int i = 0, col = 0; i < g->n; col += g->out[i++])
        if (forward_ld(prec, DT_LINEAR, out + col, width, inp, g->W[i], NULL, N, IN, g->out[i]))
            return -1;
    return 0;
}

/* The input's gradient (dinp not NULL) and the weights' (dW[0] not NULL),
 * each in one product when its matrices are adjacent, both from one
 * rounding of dout in bf16 when they are. */
int dt_linear_group_backward(dt_precision prec, float *dinp, int dinp_accumulate,
                             const dt_linear_group *g, const float *dout, const float *inp, int N,
                             int IN)
{
    const int width = dt_linear_group_width(g);
    const int one_x = !dinp || adjacent(g->W, g, IN);
    const int one_w = !g->dW[0] || adjacent((const float *const *)g->dW, g, IN);
    if (one_x && one_w)
        return backward_ld(prec, DT_LINEAR, dinp, dinp_accumulate, g->dW[0], NULL, dout, width,
                           inp, g->W[0], N, IN, width);
    for (int i = 0, col = 0; i < g->n; col += g->out[i++]) {
        float *x = dinp && !one_x ? dinp : NULL, *w = g->dW[0] && !one_w ? g->dW[i] : NULL;
        if (backward_ld(prec, DT_LINEAR, x, dinp_accumulate || i > 0, w, NULL, dout + col,
                        width, inp, g->W[i], N, IN, g->out[i]))
            return -1;
    }
    if (one_x && dinp)
        return backward_ld(prec, DT_LINEAR, dinp, dinp_accumulate, NULL, NULL, dout, width, NULL,
                           g->W[0], N, IN, width);
    if (one_w && g->dW[0])
        return backward_ld(prec, DT_LINEAR, NULL, 0, g->dW[0], NULL, dout, width, inp, NULL, N,
                           IN, width);
    return 0;
}
