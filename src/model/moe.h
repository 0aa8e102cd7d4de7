/* Mixture of experts: the configuration of a layer's `moe` branch (the
 * block kind in model/blocks/moe.c: a router and E experts of GPT-2's MLP
 * shape, each token computed by its top K) and what its forward counts
 * per layer for the log: the balance losses and the experts' load. The
 * flags are Megatron's (--num-experts, --moe-router-topk, ...). */
#ifndef DT_MODEL_MOE_H
#define DT_MODEL_MOE_H

#include <stddef.h>
#include <stdint.h>

/* Experts a layer may have: DeepSeek-V3's 256 routed experts. */
enum { DT_MOE_MAX_EXPERTS = 256 };

/* The busiest expert-parallel rank's routed rows over the mean that
 * `dtrain plan` and `dtrain simulate` assume: a router with a balance loss
 * is still skewed (Megatron users report 1.2 to 1.5). */
#define DT_MOE_SKEW 1.3

typedef struct {
    int experts;      /* E; 0: a dense model */
    int ffn;          /* each expert's hidden width F; 0: GPT-2's 4 C */
    int topk;         /* K experts per token */
    double capacity;  /* capacity factor; 0: dropless (see dt_moe_capacity) */
    double aux_coeff; /* the sequence-wise balance loss's weight */
    double z_coeff;   /* the router z-loss's weight */
    int expert_bias;  /* aux-loss-free balance: a bias per expert on the choice */
    double bias_rate; /* how far each step moves the bias */
    int force_balance; /* benchmarking: logits from a hash of each position,
                        * not the router (Megatron's --moe-router-force-load-balancing) */
} dt_moe_config;

/* What one layer's forwards counted since the last reset, over this
 * rank's rows: the balance loss summed over sequences (sum_e f_e P_e, per
 * sequence, before the coefficient), the z-loss summed over tokens
 * (logsumexp^2), the routing slots each expert took (after drops) and
 * the slots dropped. */
typedef struct {
    double aux_sum, z_sum;
    double seqs, tokens;
    double dropped;
    double load[DT_MOE_MAX_EXPERTS];
} dt_moe_layer_stats;

/* The model's side of its moe layers (dt_gpt.moe). */
typedef struct {
    dt_moe_layer_stats *stats; /* [n_layer], counted by every forward that runs a whole layer */
    float *bias;               /* [n_layer][E] with expert_bias: added to the choice's scores */
    float grad_scale;          /* the loss weight of a token in the backward running */
} dt_gpt_moe;

/* The tokens an expert takes per sequence of t tokens under capacity
 * factor cf (> 0): ceil(cf t K / E). Slots are kept in position order
 * (token by token, each token's K choices in rank order) until an expert
 * is full; the later ones are dropped, their share of the output lost.
 * Per sequence, so the same tokens drop however the batch is split over
 * ranks or micro-batches. */
int dt_moe_capacity(const dt_moe_config *moe, int t);

/* "ln_1:layernorm,attn:attention,ln_2:layernorm,mlp:moe": GPT-2's layer
 * with its MLP replaced by experts, the default blocks of a model with
 * experts. */
extern const char dt_blocks_gpt2_moe[];

#endif
