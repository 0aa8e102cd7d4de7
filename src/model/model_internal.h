/* What the model's files and its block kinds share, and nothing outside
 * model/ includes: the segment protocol's steps (segment.c), tensor
 * parallelism's sums (block_ops.c), the products' backward halves, and the
 * driver of a layer's blocks (layer.c). */
#ifndef DT_MODEL_INTERNAL_H
#define DT_MODEL_INTERNAL_H

#include "kernels/linear.h"
#include "model/gpt.h"

/* Tensors start on 64-byte boundaries so that every kernel sees aligned rows. */
#define DT_TENSOR_ALIGN_FLOATS 16

/* ---- segment.c: the protocol a strategy hooks (gpt.h: dt_gpt_hooks) ---- */

/* What forward and backward read of a segment (its values from the
 * first, while the segment is needed): the parameters, or their widened
 * copy; and of one tensor. */
float *dt_model_weights(const dt_gpt *m, int segment);
float *dt_model_tensor_weights(const dt_gpt *m, int tensor);
/* Where a segment's gradients are written now, from its first value: its
 * slot apart, a strategy's slot, or grads. */
float *dt_model_grads_of(const dt_gpt *m, int segment);
/* Around each use of a segment's parameters: the strategy's hooks, the
 * widened copy of mixed precision, and (backward) its gradients opened. */
int dt_model_need(dt_gpt *m, int segment, int use);
void dt_model_done(dt_gpt *m, int segment, int use);
/* Before a backward's first gradient of a segment lands (gpt.h:
 * dt_gpt_accum): a slot holding its bf16 sum widened, or zeros. */
int dt_model_grads_open(dt_gpt *m, int segment);
/* This backward (or half) is through with the segment: its slot folded
 * into the sum; report: the segment's gradient is final (grad_ready);
 * done: both. */
void dt_model_segment_close(dt_gpt *m, int segment);
void dt_model_segment_report(dt_gpt *m, int segment);
void dt_model_segment_done(dt_gpt *m, int segment);
/* The segment tensor i belongs to, and the first tensor of layer l. */
int dt_model_segment_of(const dt_gpt *m, int tensor);
int dt_model_layer_tensor0(const dt_gpt *m, int l);

/* ---- block_ops.c: the sums tensor and sequence parallelism need ------- */

int dt_model_fail_matmul(dt_gpt *m, const char *where);
/* buf over the tensor-parallel group (split.h); nothing unsplit. */
int dt_model_tp_reduce(dt_gpt *m, void *buf, size_t n, dt_tp_op op, const char *where);
/* Sequence parallelism's share of a micro-batch's N rows between the
 * products: R rows from row `first`; all N without it. */
size_t dt_model_region_rows(const dt_gpt *m, size_t N);
size_t dt_model_region_first(const dt_gpt *m, size_t N);
/* A norm's output [N, C] whose region rows this rank wrote: with sequence
 * parallelism the other rows gathered from the group (the column-parallel
 * product after it reads every row). */
int dt_model_rows_gather(dt_gpt *m, float *out, int N, const char *name);
/* A region's gradient d [R, C] as every row's [N, C]: d itself, or with
 * sequence parallelism gathered from the group into the scratch (a
 * row-parallel product's backward reads every row). NULL on failure. */
const float *dt_model_rows_gathered(dt_gpt *m, const float *d, int N, const char *name);
/* The gradient of a column-parallel product's input, d_c [N, C]: the
 * ranks' partial sums summed over the group, or with sequence parallelism
 * reduce-scattered (this rank's rows at d_c's start). */
int dt_model_input_grad_sum(dt_gpt *m, int N, const char *name);
/* Weight gradients from the rows between the products (a norm's, a
 * branch's that is not split) are of this rank's rows alone under
 * sequence parallelism: begin gives a zeroed buffer of n floats (n <= 2 C)
 * for them; end sums it over the group and adds piece k (each n / k) into
 * g[k]. Without sequence parallelism begin returns NULL: add directly. */
float *dt_model_region_grads_begin(dt_gpt *m, size_t n);
int dt_model_region_grads_end(dt_gpt *m, float *const *g, int k, size_t n, const char *name);
void dt_model_add_into(float *dst, const float *a, const float *b, size_t n);

/* One product's share of a backward (W in layout lay): dinp, and dW, db.
 * A split backward's input half leaves dW and db for later and keeps dout
 * in `keep`; its weight half (dt_model_product_weights, the layout of c's
 * kind) takes it from there. */
int dt_model_product_backward(dt_gpt *m, dt_bwd_part what, dt_wlayout lay, float *dinp,
                              int dinp_accumulate, float *dW, float *db, const float *dout,
                              float *keep, const float *inp, const float *W, int N, int IN,
                              int OUT, const char *name);
int dt_model_product_weights(dt_gpt *m, const dt_block_call *c, float *dW, float *db,
                             const float *dout, const float *inp, int N, int IN, int OUT,
                             const char *name);

/* A branch's last product, row-parallel from its inner width IN into the
 * residual stream: c->a[0] (its residual sum) = (inp @ W + bias) + c->res
 * (W in the layout of c's kind).
 * And its backward's start: d(residual sum) gathered to every row, then
 * that product's backward (dinp [N, IN]; dW, db, or with a split backward
 * the output's gradient kept in keep). */
int dt_model_branch_out(dt_gpt *m, const dt_block_call *c, const float *inp, const float *W,
                        const float *bias, int IN, const char *name);
int dt_model_branch_out_backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what,
                                 float *dinp, float *dW, float *db, float *keep,
                                 const float *inp, const float *W, int IN, const char *name);
/* A branch's first product's backward, column-parallel from its input
 * c->x [N, C] to its inner width OUT: the input's gradient into d_c,
 * summed over the tensor-parallel group (dt_model_input_grad_sum). */
int dt_model_branch_in_backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what, float *dW,
                                float *db, const float *dout, float *keep, const float *W,
                                int OUT, const char *name);
/* A branch's first products when several read its input c->x (q, k and
 * v; gate and up), as one where their tensors lie one after another
 * (kernels/linear.h): tensors [first, first + n) of c, Linear layout,
 * out[i] wide. Forward into out [N, sum out]; backward from dout [N, sum
 * out] as dt_model_branch_in_backward's; the weight half from the kept
 * dout. */
dt_linear_group dt_model_group(const dt_block_call *c, int first, int n, const int *out);
int dt_model_group_forward(dt_gpt *m, const dt_block_call *c, const dt_linear_group *g,
                           float *out, const char *name);
int dt_model_group_backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what,
                            const dt_linear_group *g, const float *dout, float *keep,
                            const char *name);
int dt_model_group_weights(dt_gpt *m, const dt_block_call *c, const dt_linear_group *g,
                           const float *dout, const char *name);
/* Causal attention over the call's rows, t of each of its b sequences
 * (qkv [b, t, 3A] -> att [b, t, A], lse [b, heads, t]): on this rank alone,
 * or with the rest of each sequence on the context-parallel group's ranks.
 * The backward takes the attention output's gradient from m->acts.d_c. */
int dt_model_attend(dt_gpt *m, const dt_block_call *c, float *att, float *lse, const float *qkv);
int dt_model_attend_backward(dt_gpt *m, const dt_block_call *c, float *dqkv, const float *qkv,
                             const float *att, const float *lse);

/* ---- moe.c: the configuration's checks, the counts' buffers ---------- */

/* A model's experts and routing against its blocks (n of them, parsed):
 * a moe branch needs experts, and experts a moe branch. 0 or -1. */
int dt_moe_config_check(const dt_gpt_config *cfg, const dt_block *b, int n, char *err,
                        size_t errlen);
int dt_model_moe_alloc(dt_gpt *m);
void dt_model_moe_free(dt_gpt *m);

/* ---- layer.c: a layer's blocks in order ------------------------------- */

/* Layer l's forward from x (its input, R rows) in the bound slot; rebuild:
 * what the recompute mode did not keep, before its backward. */
int dt_model_layer_forward(dt_gpt *m, int l, const float *x, int b, int t);
int dt_model_layer_rebuild(dt_gpt *m, int l, const float *x, int b, int t);
/* Layer l's backward from d(output) in d_res to d(input) in d_res: the
 * whole, or its input half; and the weight half. */
int dt_model_layer_backward(dt_gpt *m, int l, const float *x, int b, int t, dt_bwd_part what);
int dt_model_layer_weights(dt_gpt *m, int l, const float *x, int b, int t);
/* Layer l's output (the last branch's residual sum) in the bound slot. */
float *dt_model_layer_output(const dt_gpt *m, int l);
/* A call of block `blk` (tensors from `tensor0` of the layout) on the
 * weights forward and backward read (dt_model_tensor_weights) and g, the
 * gradients of the block's segment it adds to (dt_model_grads_of), or
 * NULL. */
void dt_model_block_call(const dt_gpt *m, const dt_block *blk, int tensor0, float *g,
                         dt_block_call *c);

/* ---- embed.c, head.c: the parts before and after the layers ----------- */

int dt_model_embed_forward(dt_gpt *m, const int32_t *tokens, int b, int t);
int dt_model_embed_backward(dt_gpt *m, const float *d, const dt_gpt_slot *st);
int dt_model_pick_rows(dt_gpt *m, int k, const int32_t *tokens, const int32_t *targets, int b,
                       int t);
int dt_model_head_forward(dt_gpt *m, const float *x, int N);
double dt_model_head_loss(dt_gpt *m, const int32_t *targets, int N);
int dt_model_head_backward(dt_gpt *m, const dt_gpt_slot *st, const float *lnf_in,
                           float grad_scale, dt_bwd_part what);
int dt_model_head_weights(dt_gpt *m, const dt_gpt_slot *st);

#endif
