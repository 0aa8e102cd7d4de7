/* Softmax cross-entropy over a vocabulary split across ranks (tensor
 * parallelism): each rank holds the logits of its slice only, and the whole
 * rows are never gathered. The kernels here do the local steps; the caller
 * all-reduces between them.
 *   logits, exps, dlogits [N, Vl]   this slice's columns [v0, v0 + Vl) of [N, V]
 *   targets, losses [N]             targets are global ids; outside [0, V): ignored
 *   max [N] float                   all-reduce with MAX
 *   sum, target_logit [N] double    all-reduce with SUM
 *
 * Order of calls (the arrows are the caller's all-reduces):
 *   split_max -> MAX -> split_sums -> SUM -> split_losses, split_backward
 * sum and target_logit are both double so that one SUM all-reduce of a [2, N]
 * buffer carries them: the sum of exponentials must stay double (the unsplit
 * kernel sums in double), and a target logit is one float plus zeros from
 * the other ranks, exact in double and back in float.
 *
 * With one slice (v0 = 0, Vl = V) the results are the bits of
 * dt_crossentropy; with more, they differ only in the order in which the
 * exponentials are summed. */
#ifndef DT_KERNELS_CROSSENTROPY_SPLIT_H
#define DT_KERNELS_CROSSENTROPY_SPLIT_H

#include <stdint.h>

/* Slice r of N of a vocabulary of V: ceil(V / N) entries each, the last ones
 * shorter and possibly empty (V = 9, N = 4 gives 3, 3, 3, 0). An empty slice
 * is valid everywhere below: max -inf, sums 0, nothing written. */
void dt_vocab_slice(int V, int N, int r, int *v0, int *Vl);

/* max[i] = the largest of this slice's logits in row i (-inf when Vl = 0). */
void dt_crossentropy_split_max(float *max, const float *logits, int N, int Vl);

/* Given the global max: sum[i] = sum over the slice of exp(logit - max[i]),
 * target_logit[i] = the target's logit when it lies in this slice, else 0;
 * both 0 on ignored rows. When exps is not NULL it receives the exponentials
 * for split_backward (rows of ignored targets left as they were); it may
 * alias logits, so the logits buffer can go on to hold the gradient, as with
 * dt_crossentropy. */
void dt_crossentropy_split_sums(double *sum, double *target_logit, float *exps,
                                const float *logits, const float *max, const int32_t *targets,
                                int N, int Vl, int v0, int V);

/* Given the global max, sum and target logit: losses[i] = max + log(sum) -
 * target_logit, 0 on ignored rows. Returns their sum in double. The same on
 * every rank. */
double dt_crossentropy_split_losses(float *losses, const float *max, const double *sum,
                                    const double *target_logit, const int32_t *targets, int N,
                                    int V);

/* dlogits = (exps / sum - onehot(target)) * grad_scale over this slice, from
 * the exponentials split_sums wrote (dlogits may alias exps); zero rows where
 * the target is ignored. Taking the exponentials, not the logits, keeps to
 * one exp pass, as in dt_crossentropy. */
void dt_crossentropy_split_backward(float *dlogits, const float *exps, const double *sum,
                                    const int32_t *targets, int N, int Vl, int v0, int V,
                                    float grad_scale);

#endif
