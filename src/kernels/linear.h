/* A linear layer, its weight in one of Hugging Face's two layouts:
 *   GPT-2's Conv1D  W [IN, OUT], out = inp @ W + b    (dt_linear_forward)
 *   torch's Linear  W [OUT, IN], out = inp @ W^T + b  (the Llama family's;
 *                   the _l functions with DT_LINEAR)
 *   inp [N, IN], b [OUT] (may be NULL), out [N, OUT]. */
#ifndef DT_KERNELS_LINEAR_H
#define DT_KERNELS_LINEAR_H

#include <stddef.h>

#include "kernels/matmul.h"

typedef enum { DT_CONV1D = 0, DT_LINEAR = 1 } dt_wlayout;

/* out = inp @ W + b (overwrites out). Returns 0 or -1 (dt_matmul_error). */
int dt_linear_forward(dt_precision prec, float *out, const float *inp, const float *W,
                      const float *b, int N, int IN, int OUT);
/* dinp = dout @ W^T (overwrites when dinp_accumulate is 0, adds when 1;
 * dinp may be NULL to skip, and W with it), dW += inp^T @ dout (dW may be
 * NULL to skip, and inp with it), db += column sums of dout (db may be
 * NULL). A backward split in two halves calls it once for dinp, once for
 * dW and db: the same products on the same operands. Returns 0 or -1. */
int dt_linear_backward(dt_precision prec, float *dinp, int dinp_accumulate, float *dW, float *db,
                       const float *dout, const float *inp, const float *W, int N, int IN,
                       int OUT);
/* The same in either layout (dW then has W's). */
int dt_linear_forward_l(dt_precision prec, dt_wlayout lay, float *out, const float *inp,
                        const float *W, const float *b, int N, int IN, int OUT);
int dt_linear_backward_l(dt_precision prec, dt_wlayout lay, float *dinp, int dinp_accumulate,
                         float *dW, float *db, const float *dout, const float *inp,
                         const float *W, int N, int IN, int OUT);

/* out[r][j] = (x[r][j] + b[j]) + res[r][j] for r < rows, j < cols (b NULL:
 * x + res; out may alias x): a product's output joining the residual
 * stream, its bias added in the same pass. The sum is the bias first, as
 * a product with its bias fused in rounds it, then the residual. */
void dt_linear_bias_residual(float *out, const float *x, const float *b, const float *res,
                             size_t rows, size_t cols);

/* Products that read one input (q, k and v; gate and up): Linear-layout
 * weights W[i] [out[i], IN], their outputs side by side in out [N, sum
 * out]. Weights stored one after another (W[i + 1] == W[i] + out[i] IN, as
 * the model's tensor offsets place them when each size is a multiple of
 * their alignment) are one [sum out, IN] matrix and one product, wider and
 * so faster than its parts; else each weight is its own product, into its
 * columns. The same holds for the gradients dW[i]. */
enum { DT_LINEAR_GROUP_MAX = 4 };
typedef struct {
    int n;
    int out[DT_LINEAR_GROUP_MAX];
    const float *W[DT_LINEAR_GROUP_MAX];
    float *dW[DT_LINEAR_GROUP_MAX];
} dt_linear_group;

/* sum out: the group's output width. */
int dt_linear_group_width(const dt_linear_group *g);
/* out = inp @ [W_0; W_1; ...]^T. Returns 0 or -1 (dt_matmul_error). */
int dt_linear_group_forward(dt_precision prec, float *out, const float *inp,
                            const dt_linear_group *g, int N, int IN);
/* dinp = dout @ [W_0; W_1; ...] (or += with dinp_accumulate; dinp NULL to
 * skip), dW[i] += dout's columns of i, transposed, @ inp (dW[0] NULL to
 * skip). Returns 0 or -1. */
int dt_linear_group_backward(dt_precision prec, float *dinp, int dinp_accumulate,
                             const dt_linear_group *g, const float *dout, const float *inp, int N,
                             int IN);

#endif
