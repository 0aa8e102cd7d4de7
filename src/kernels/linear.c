/*
 * Linear layer in Conv1D layout.
 *   inp [N, IN], W [IN, OUT], b [OUT], out/dout [N, OUT], dinp [N, IN]
 * Forward is one product with the bias fused in. Backward is two products
 * (dinp = dout @ W^T, dW += inp^T @ dout) and the bias gradient, a column
 * sum of dout; in bf16 the two products share one rounded copy of dout.
 */
#include "kernels/linear.h"

#include <stddef.h>

#include "kernels/matmul_problem.h"
#include "kernels/threads.h"

int dt_linear_forward(dt_precision prec, float *out, const float *inp, const float *W,
                      const float *b, int N, int IN, int OUT)
{
    dt_matmul_problem p = {.prec = prec, .M = N, .N = OUT, .K = IN, .alpha = 1.0f, .beta = 0.0f,
                           .A = inp, .B = W, .lda = IN, .ldb = OUT, .ldc = OUT, .bias = b,
                           .C = out};
    return dt_matmul_solve(&p);
}

/* dinp = dout @ W^T (or +=), dW += inp^T @ dout */
static int dinp_product_then_dW(dt_precision prec, float *dinp, int dinp_accumulate, float *dW,
                                const float *dout, const float *inp, const float *W, int N,
                                int IN, int OUT)
{
    if (dinp && dt_matmul(prec, 0, 1, N, IN, OUT, 1.0f, dout, OUT, W, OUT,
                          dinp_accumulate ? 1.0f : 0.0f, dinp, IN))
        return -1;
    return dW ? dt_matmul(prec, 1, 0, IN, OUT, N, 1.0f, inp, IN, dout, OUT, 1.0f, dW, OUT) : 0;
}

#define SUM_BLOCK 64

/* db += column sums of dout. Each block of columns is summed over all rows
 * in row order, in double, by one thread: the result does not depend on the
 * thread count, and no thread writes another's columns. */
static void add_column_sums(float *db, const float *dout, int N, int OUT)
{
    int blocks = (OUT + SUM_BLOCK - 1) / SUM_BLOCK;
    int nt = dt_kernels_threads();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int blk = 0; blk < blocks; blk++) {
        int c0 = blk * SUM_BLOCK;
        int width = OUT - c0 < SUM_BLOCK ? OUT - c0 : SUM_BLOCK;
        double acc[SUM_BLOCK] = {0};
        for (int i = 0; i < N; i++) {
            const float *row = dout + (size_t)i * OUT + c0;
#pragma omp simd
            for (int j = 0; j < width; j++) acc[j] += row[j];
        }
        for (int j = 0; j < width; j++) db[c0 + j] += (float)acc[j];
    }
}

/* bf16: dout feeds both products, so it is rounded once, here. */
static int products_bf16(float *dinp, int dinp_accumulate, float *dW, const float *dout,
                         const float *inp, const float *W, int N, int IN, int OUT)
{
    uint16_t *dout16 = dt_matmul_bf16_buffer((size_t)N * OUT);
    if (!dout16) /* no memory for the shared copy: each product rounds its own */
        return dinp_product_then_dW(DT_PREC_BF16, dinp, dinp_accumulate, dW, dout, inp, W, N,
                                    IN, OUT);
    dt_matmul_round_bf16(dout16, dout, N, OUT, OUT);
    dt_matmul_problem dx = {.prec = DT_PREC_BF16, .transB = 1, .M = N, .N = IN, .K = OUT,
                            .alpha = 1.0f, .beta = dinp_accumulate ? 1.0f : 0.0f, .A16 = dout16,
                            .B = W, .lda = OUT, .ldb = OUT, .ldc = IN, .C = dinp};
    dt_matmul_problem dw = {.prec = DT_PREC_BF16, .transA = 1, .M = IN, .N = OUT, .K = N,
                            .alpha = 1.0f, .beta = 1.0f, .A = inp, .B16 = dout16, .lda = IN,
                            .ldb = OUT, .ldc = OUT, .C = dW};
    return (dinp && dt_matmul_solve(&dx)) || (dW && dt_matmul_solve(&dw)) ? -1 : 0;
}

int dt_linear_backward(dt_precision prec, float *dinp, int dinp_accumulate, float *dW, float *db,
                       const float *dout, const float *inp, const float *W, int N, int IN,
                       int OUT)
{
    int rc = prec == DT_PREC_BF16
                 ? products_bf16(dinp, dinp_accumulate, dW, dout, inp, W, N, IN, OUT)
                 : dinp_product_then_dW(prec, dinp, dinp_accumulate, dW, dout, inp, W, N, IN, OUT);
    if (rc) return -1;
    if (db) add_column_sums(db, dout, N, OUT);
    return 0;
}
