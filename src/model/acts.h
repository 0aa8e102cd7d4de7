/* The model's activations: one arena per run, sized once, holding what
 * every micro-batch shares (backward's scratch, the layer's worth that a
 * recompute mode rebuilds) and one slot per micro-batch in flight, each
 * carved for its part of the model. One process training alone has one
 * slot of the whole model; a pipeline stage has as many as its schedule
 * keeps in flight. The buffers of a layer are its blocks' (model/block.h),
 * so the arena follows the layer's kinds. */
#ifndef DT_MODEL_ACTS_H
#define DT_MODEL_ACTS_H

#include <stddef.h>
#include <stdint.h>

#include "model/block.h"

/* What backward keeps of each layer's forward, and what it rebuilds right
 * before that layer's backward (so that whatever must happen before a
 * layer's backward also covers it):
 *   NONE       keeps every buffer.
 *   SELECTIVE  keeps the outputs of the matrix products and the residual
 *              stream; rebuilds the element-wise parts (the norms, GELU).
 *   FULL       keeps only the residual stream leaving each layer (so each
 *              layer's input); rebuilds the rest by running the layer's
 *              forward again, but for its last branch's output, which
 *              backward does not read.
 * What is rebuilt lives in one layer's worth of buffers that all layers
 * share. The numbers are those of NONE, bit for bit: the same kernels run
 * on the same inputs. Sizes: dt_gpt_layer_act_bytes. */
typedef enum { DT_RECOMPUTE_NONE = 0, DT_RECOMPUTE_SELECTIVE, DT_RECOMPUTE_FULL } dt_recompute;

/* "none", "selective", "full" -> *mode; 0, or -1 for any other name. */
int dt_recompute_parse(const char *name, dt_recompute *mode);
const char *dt_recompute_name(dt_recompute mode);

/* A part of the model that one pipeline stage (or chunk) runs: layers
 * [l0, l1), with the embeddings when l0 == 0 and the final norm, the tied
 * output head and the loss when l1 == n_layer. The whole model is
 * {0, n_layer}. */
typedef struct {
    int l0, l1;
} dt_gpt_part;

/* One micro-batch's activations of a part, from its forward to its
 * backward. A pipeline stage holds several at once (1F1B: up to p - r). */
typedef struct {
    dt_gpt_part part;
    float *base;                    /* its piece of the arena */
    const int32_t *tokens, *targets; /* of its forward (the caller keeps them) */
    const int32_t *row_tokens;      /* this rank's rows of tokens (context parallelism's
                                       pick, in m->cp; else tokens) */
    int b, t;                       /* its forward's shape; 0: no forward pending */
    int weights_pending;            /* its input's gradient is done, its weights' not */
    int input_grad_apart;           /* its last backward left the input's gradient in
                                       dinput (a split one), not in the input buffer */
} dt_gpt_slot;

/* The arena, and the pointers of the bound slot. */
typedef struct {
    dt_recompute recompute; /* set before dt_gpt_alloc_acts (default NONE) */
    int split_backward;     /* set before allocating slots: each slot can run its
                               backward in two halves (dt_gpt_backward_part) */
    dt_recompute mode;      /* the mode the arena was carved for */
    int split;              /* split_backward when the arena was carved */
    int rebuilt_layer;      /* the layer whose rebuilt buffers the shared ones hold, or -1 */
    int rebuilt_slot;       /* and the slot it belongs to */
    int B, T;
    float *mem;
    size_t floats;
    int nslots, slot;       /* the slots, and the one bound now */
    dt_gpt_slot *slots;
    int per_layer;          /* buffers of a layer: its blocks' acts, in block order */
    float **layer;          /* [L][per_layer]: the bound slot's (shared and scratch
                               ones point at the common piece) */
    float **shared;         /* [per_layer]: the common piece's, or NULL */
    float *encoded;         /* [R, C]: the part's input (the embeddings' output, or the
                               activation received from the stage before); after a whole
                               backward without the embeddings, the gradient of that input */
    float *dinput;          /* [R, C], with split_backward: the input's gradient from a split
                               backward (the input stays for the weights' half, which may
                               rebuild layers from it) */
    float *final[DT_BLOCK_MAX_ACTS]; /* the final norm's buffers; [0] its output [N, C] */
    float *logits;          /* [N, V] (tp: [N, vocab]); holds its own gradient after
                               backward (tp: the exponentials after forward) */
    float *losses;          /* [N] */
    float *ce_max;          /* tp: [N] the rows' largest logits */
    double *ce_sums;        /* tp: [2, N] the sums of exponentials, target logits */
    float *d_res, *d_c;     /* backward's gradients of the residual stream and of a
                               block's input or output, [N, C] each */
    float *sp_full, *sp_ln; /* sequence parallelism: [N, C] gathered, [2C] */
} dt_gpt_acts;

/* Whether micro-batches of B sequences of length T fit the layout: the
 * block, context parallelism's cut of the sequence, sequence
 * parallelism's split of the rows over tp. 0, or -1 with m->error. The
 * allocations below check it; `dtrain simulate` checks a layout by it. */
int dt_gpt_check_micro_batch(dt_gpt *m, int B, int T);
/* Activations for micro-batches of B sequences of length T <= block_size:
 * one slot of the whole model. */
int dt_gpt_alloc_acts(dt_gpt *m, int B, int T);
/* n slots, slot k for parts[k] (each 0 <= l0 < l1 <= n_layer), sharing
 * backward's scratch and the recompute mode's rebuilt layer. 0, or -1. */
int dt_gpt_alloc_slots(dt_gpt *m, int B, int T, int n, const dt_gpt_part *parts);
/* Floats dt_gpt_alloc_acts would take for B x T (in the recompute mode),
 * allocating nothing; and dt_gpt_alloc_slots. */
size_t dt_gpt_acts_floats(const dt_gpt *m, int B, int T);
size_t dt_gpt_slots_floats(const dt_gpt *m, int B, int T, int n, const dt_gpt_part *parts);
void dt_gpt_free_acts(dt_gpt *m);
/* Points the activation fields at slot k's buffers. */
void dt_gpt_bind_slot(dt_gpt *m, int k);
/* Slot k's input activation (where a stage receives it), and its part's
 * output, the last layer's (what a stage sends on); after
 * dt_gpt_backward_slot of a part without the embeddings the input buffer
 * holds the input's gradient (what a stage sends back). */
float *dt_gpt_slot_input(dt_gpt *m, int k);
const float *dt_gpt_slot_output(dt_gpt *m, int k);
/* Where slot k's last backward left its input's gradient. */
float *dt_gpt_slot_input_grad(dt_gpt *m, int k);
/* Floats of a stage's input or output on this rank for b sequences of t:
 * its rows of them (context parallelism), 1/tp of those with sequence
 * parallelism, n_embd wide. What a pipeline's stages exchange. */
size_t dt_gpt_boundary_floats(const dt_gpt *m, int b, int t);
/* Layer l's residual stream after its block `block` (a branch) in the
 * bound slot: what tests compare across layouts. NULL if none. */
const float *dt_gpt_residual(const dt_gpt *m, int l, int block);

/* Activation bytes of one GPT-2 layer for a micro-batch of B sequences of
 * T tokens, width C, NH heads, in `mode`, all fp32 (4 bytes), N = B T:
 *   kept per layer, from its forward to its backward:
 *     none       4 (16 N C + (4 + NH) N)   ln1 qkv att res2 ln2 fc fc_gelu res3:
 *                                          1+3+1+1+1+4+4+1 = 16 rows of C;
 *                                          2 LayerNorms' mean and rstd; lse
 *     selective  4 (10 N C + NH N)         qkv att res2 fc res3, lse
 *     full       4 N C                     res3
 *   *shared (may be NULL): the one layer's worth that all layers share
 *     none       0
 *     selective  4 (6 N C + 4 N)           ln1 ln2 fc_gelu, means, rstds
 *     full       4 (15 N C + (4 + NH) N)   all of none's but res3
 * The arena (dt_gpt_acts_floats) holds L times the first, the second once,
 * and what does not depend on the mode: the embeddings' output, the final
 * LayerNorm, logits, losses and backward's scratch, 4 (11 N C + 3 N + N V)
 * bytes; plus up to 60 bytes of alignment per buffer (none where N and V
 * are multiples of 16). The arena itself is carved from the blocks'
 * own lists of buffers; these closed forms are what it must come to. */
size_t dt_gpt_layer_act_bytes(dt_recompute mode, int B, int T, int C, int NH, size_t *shared);
/* The same for this rank's layer, from its blocks' own lists (its cuts,
 * its kinds, the recompute mode set on it), without alignment: bytes kept
 * per layer, and *shared those every layer shares (not backward's scratch). */
size_t dt_gpt_layer_acts_bytes(const dt_gpt *m, int B, int T, size_t *shared);
/* A whole layer's bytes kept with no recomputation, for a configuration
 * (its blocks, no cut): what planning weighs before any model exists. 0
 * for a configuration that makes no model. */
size_t dt_gpt_config_layer_act_bytes(const dt_gpt_config *cfg, int B, int T);

#endif
