/* A linear layer in Hugging Face GPT-2's Conv1D layout: the weight is stored
 * [IN, OUT], so out = inp @ W + b.
 *   inp [N, IN], W [IN, OUT], b [OUT] (may be NULL), out [N, OUT]. */
#ifndef DT_KERNELS_LINEAR_H
#define DT_KERNELS_LINEAR_H

#include "kernels/matmul.h"

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

#endif
