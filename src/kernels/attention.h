/* Causal multi-head self-attention, fused and blocked: scores are formed a
 * block at a time with an online softmax, never as a T x T matrix per head;
 * backward recomputes them from q, k and the saved log-sum-exp.
 *   qkv [B, T, 3C]: q, k, v side by side, each [NH, HS] per token (C = NH*HS),
 *       the layout of GPT-2's c_attn output.
 *   out [B, T, C]: heads side by side.
 *   lse [B, NH, T]: log-sum-exp of each row of scaled scores, for backward.
 * Scale 1/sqrt(HS). */
#ifndef DT_KERNELS_ATTENTION_H
#define DT_KERNELS_ATTENTION_H

void dt_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
/* dqkv = gradient w.r.t. qkv (overwrites). */
void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int C, int NH);

#endif
