/* A mixture-of-experts router, pure math on a micro-batch of N rows (b
 * sequences of t tokens) and E experts, each row routed to its top K:
 *   probs = softmax(logits) in fp32, lse its log-sum-exp;
 *   choice [N, K] the K largest of probs (+ bias, for the choice only),
 *     in descending order, ties to the lower expert index;
 *   weight [N, K] their probabilities renormalized to sum to 1 (Mixtral);
 *   keep [N, K] 0 for the slots beyond an expert's share of a sequence;
 *   order: the kept slots (row K + k) sorted by expert, rows ascending
 *     within one, with each expert's count: the grouped products' rows.
 * And backward: the gradient of the logits from the weights' gradient,
 * the sequence-wise balance loss and the z-loss. */
#ifndef DT_KERNELS_ROUTER_H
#define DT_KERNELS_ROUTER_H

#include <stddef.h>
#include <stdint.h>

/* Benchmarking's even router (--moe-router-force-load-balancing): one
 * row's E logits uniform in [-1, 1), a hash of the salt alone (the
 * caller's: the layer and the row's position), never of the input, whose
 * last bits differ between layouts that sum in other orders. */
void dt_router_hash_logits(float *logits, int E, uint64_t salt);
void dt_router_softmax(float *probs, float *lse, const float *logits, int N, int E);
void dt_router_topk(int32_t *choice, float *weight, const float *probs, const float *bias,
                    int N, int E, int K);
/* keep: sequence by sequence (rows [s t, (s + 1) t)), 0 for the slots of
 * an expert past its first cap in position order (cap <= 0: none);
 * returns how many. */
long dt_router_capacity(int32_t *keep, const int32_t *choice, int b, int t, int K, int E,
                        int cap);
/* order [<= N K], count [E]; pos [N K]: where slot (row, k) sits in order,
 * -1 if dropped (keep NULL: none is). Returns the kept slots. */
int dt_router_sort(int32_t *order, int32_t *count, int32_t *pos, const int32_t *choice,
                   const int32_t *keep, int N, int E, int K);

/* cnt [b][E]: each sequence's slots choosing each expert, before drops,
 * from choice [b][t][K] of whole sequences. */
void dt_router_seq_counts(int32_t *cnt, const int32_t *choice, int b, int t, int K, int E);

/* The balance terms' counts, for rows [b][t] that may be a part of
 * sequences of T (context parallelism: this rank's rows), cnt the whole
 * sequences' (dt_router_seq_counts): f_e = E / (K T) cnt[e], and P_e's
 * share from these rows, sum over them of probs[., e] / T; adds sum_e f_e
 * P_e's share of each sequence to *aux_sum, the z-loss's lse^2 of every
 * row to *z_sum, and the kept slots' count per expert to load[E]. */
void dt_router_stats(const float *probs, const float *lse, const int32_t *choice,
                     const int32_t *keep, const int32_t *cnt, int b, int t, int T, int E, int K,
                     double *aux_sum, double *z_sum, double *load);

/* dlogits [N, E] from dweight [N, K] (the combined output's gradient
 * dotted with each slot's expert output; a dropped slot's is 0), through
 * the renormalization and the softmax, plus the balance losses'
 * gradients: each sequence's aux term weighs aux_scale (its loss weight
 * times the coefficient), with f_e from cnt, the whole sequences' counts,
 * as dt_router_stats; each row's z term weighs z_scale. Rows [b][t] of
 * sequences of T, as there. */
void dt_router_backward(float *dlogits, const float *dweight, const float *probs,
                        const float *lse, const int32_t *choice, const float *weight,
                        const int32_t *cnt, int b, int t, int T, int E, int K, float aux_scale,
                        float z_scale);

#endif
