/* A linear layer, its weight in one of Hugging Face's two layouts:
 *   GPT-2's Conv1D  W [IN, OUT], out = inp @ W + b    (dt_linear_forward)
 *   torch's Linear  W [OUT, IN], out = inp @ W^T + b  (the Llama family's;
 *                   the _l functions with DT_LINEAR)
 *   inp [N, IN], b [OUT] (may be NULL), out [N, OUT]. */
#ifndef DT_KERNELS_LINEAR_H
#define DT_KERNELS_LINEAR_H

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

#endif
