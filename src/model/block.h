/* A layer of the model is a sequence of blocks chosen by data: pairs of a
 * norm and the branch it feeds, each branch's output added to the
 * residual stream (pre-norm, as GPT-2 and the Llama family are):
 *
 *     h = x + branch_1(norm_1(x));  y = h + branch_2(norm_2(h));  ...
 *
 * A block kind (LayerNorm, attention, the GELU MLP, ...) is a file in
 * model/blocks/ that fills one dt_block_kind, and a row in the table of
 * model/blocks/table.c (or dt_block_register, for a program that links
 * the library). A kind says which tensors it has, which activation
 * buffers it keeps, and runs its forward, backward and (for a split
 * backward) weight half; the model lays out the tensors, carves the
 * buffers, recomputes, hooks the strategies and reports the segments,
 * whatever the kinds. Which kinds a layer has is the configuration's
 * `blocks` string (dt_gpt_config). */
#ifndef DT_MODEL_BLOCK_H
#define DT_MODEL_BLOCK_H

#include <stddef.h>

#include "kernels/linear.h"
#include "model/moe.h"
#include "model/split.h"

typedef struct dt_gpt dt_gpt;
typedef struct dt_gpt_config dt_gpt_config;

/* A block's tensors: a mixture of experts has a router and four per expert. */
enum {
    DT_BLOCK_MAX_TENSORS = 1 + 4 * DT_MOE_MAX_EXPERTS,
    DT_BLOCK_MAX_ACTS = 24,
    DT_LAYER_MAX_BLOCKS = 8
};

typedef enum {
    DT_BLOCK_NORM,  /* reads the residual stream (this rank's rows), writes its output [N, C] */
    DT_BLOCK_BRANCH /* reads the norm's output, adds its own to the residual stream */
} dt_block_role;

/* How a tensor starts (dt_gpt_init_weights): N(0, 0.02), N(0, 0.02 /
 * sqrt(2 L)) for a projection into the residual stream, zeros, ones. */
typedef enum { DT_INIT_ZERO, DT_INIT_ONE, DT_INIT_NORMAL, DT_INIT_RESIDUAL } dt_init_rule;

/* A rank's slice of a tensor seen as rows of columns (a 1-D tensor is one
 * row): rows [row0, row0 + rows), and of each row nblk blocks of
 * cols / nblk columns, block k from column col0 + k cstride. */
typedef struct {
    int row0, rows, nblk, col0, cstride, cols;
} dt_slice;

/* One tensor of a kind: its name after the block's ("c_attn.weight"),
 * the whole tensor's shape (d1 0: 1-D), this rank's slice, its start. */
typedef struct {
    char name[32];
    int d0, d1;
    dt_slice slice; /* rows 0: the whole tensor */
    dt_init_rule init;
    int absent;     /* this rank holds none of it (another rank's expert) */
    int apart;      /* the ranks of a group hold different tensors here (each its experts),
                     * as they hold different slices under tensor parallelism */
} dt_tensor_spec;

/* What recomputation does with an activation buffer (model/acts.h):
 *   ELEMENTWISE  rebuilt by the selective and full modes (norms, GELU)
 *   PRODUCT      rebuilt by the full mode (matrix products' outputs, the
 *                residual sums but the layer's last)
 *   SPLIT        kept from a split backward's input half to its weight
 *                half (only carved with split_backward)
 *   SCRATCH      backward's scratch, one for all layers and micro-batches
 * A branch's buffer 0 is its residual sum [R, C] (PRODUCT; the layer's
 * last branch's is the layer's output, always kept), a norm's its output
 * [N, C] (ELEMENTWISE). */
typedef enum { DT_ACT_ELEMENTWISE, DT_ACT_PRODUCT, DT_ACT_SPLIT, DT_ACT_SCRATCH } dt_act_class;

typedef struct {
    size_t floats;
    dt_act_class cls;
} dt_act_spec;

/* What a forward runs of a block: all of it, or in a rebuild before
 * backward what the recompute mode did not keep (dt_act_class). OUTPUT
 * is a branch's last product and residual sum. */
enum { DT_RUN_ELEMENTWISE = 1, DT_RUN_PRODUCTS = 2, DT_RUN_OUTPUT = 4, DT_RUN_ALL = 7 };

typedef struct dt_block dt_block;

/* One call of a block, on b sequences of t rows (N = b t rows; under
 * sequence parallelism R = N / tp of them between the products):
 *   x    a norm's input, the residual stream [R, C]; a branch's input,
 *        its norm's output [N, C]
 *   res  a branch: the residual stream it adds to [R, C]
 *   a    its buffers, in the order its acts listed them (SCRATCH too)
 *   w, g its tensors in the parameters (as forward reads them) and in
 *        the gradients it adds to
 * Backward reads the gradient of its output from the model's d_res (a
 * branch: the residual sum's) or d_c (a norm: its output's), and leaves
 * a branch's input gradient in d_c [N, C] (summed over the tensor-
 * parallel group where the branch splits it) and adds a norm's into
 * d_res [R, C]. */
typedef struct {
    const dt_block *blk;
    int layer, b, t, N;
    const float *x, *res;
    float **a;
    float *w[DT_BLOCK_MAX_TENSORS], *g[DT_BLOCK_MAX_TENSORS];
} dt_block_call;

typedef enum { DT_BWD_WHOLE = 0, DT_BWD_INPUT, DT_BWD_WEIGHTS } dt_bwd_part;

typedef struct {
    const char *name; /* as the configuration's blocks string names it */
    dt_block_role role;
    /* Its tensors for this configuration and tensor- and expert-parallel
     * cut (tp, ep may be NULL: whole); writes up to DT_BLOCK_MAX_TENSORS,
     * returns how many, the same count whatever the cut (a tensor this
     * rank does not hold is `absent`). Their order is the layout's. */
    int (*tensors)(const dt_gpt_config *cfg, const dt_gpt_tp *tp, const dt_gpt_ep *ep,
                   dt_tensor_spec *out);
    /* Its buffers for a micro-batch of N rows (R between the products);
     * writes up to DT_BLOCK_MAX_ACTS, returns how many. */
    int (*acts)(const dt_gpt *m, size_t N, size_t R, dt_act_spec *out);
    int (*forward)(dt_gpt *m, const dt_block_call *c, unsigned run);
    /* DT_BWD_WHOLE, or DT_BWD_INPUT: every gradient but its products'
     * weights and biases, keeping what weights needs in SPLIT buffers. */
    int (*backward)(dt_gpt *m, const dt_block_call *c, dt_bwd_part what);
    /* The weight half after an input half; NULL: nothing is left. */
    int (*weights)(dt_gpt *m, const dt_block_call *c);
    /* FLOPs of a training step per token (forward and backward) that
     * MFU counts: its products, 6 per weight; attention's 6 T C. */
    double (*flops)(const dt_gpt_config *cfg, int T);
    /* Its products' weights: GPT-2's Conv1D [in, out] (the default) or
     * torch's Linear [out, in] (the Llama family's). */
    dt_wlayout wlayout;
    /* A mixture of experts: routing counts on the log, expert parallelism's
     * exchanges (the `moe` kinds). */
    int experts;
} dt_block_kind;

/* A block of the layer: its kind, its name (the prefix of its tensors'
 * names, "ln_1"), and where its tensors and buffers sit among the
 * layer's. */
struct dt_block {
    const dt_block_kind *kind;
    char name[32];
    int tensor0, n_tensors;
    int act0, n_acts;
    int last; /* the layer's last branch: its residual sum is the layer's output */
};

/* The built-in kinds and those registered; NULL if none is called name. */
const dt_block_kind *dt_block_find(const char *name);
/* Adds a kind a program defines (tests do); refuses a name in use or a
 * full table. 0, or -1 with a message. */
int dt_block_register(const dt_block_kind *k, char *err, size_t errlen);
/* The blocks a configuration's string names ("ln_1:layernorm,attn:attention
 * ..."; "" is GPT-2's), checked: pairs of a norm and a branch, kinds
 * known, names unique. Fills out (DT_LAYER_MAX_BLOCKS) with kinds and
 * names and returns the count, or -1 with a message. */
int dt_blocks_parse(const char *spec, dt_block *out, char *err, size_t errlen);
/* The blocks' string in one spelling ("name:kind" joined by commas, ""
 * as GPT-2's), or spec itself when it names no blocks. */
void dt_blocks_canonical(const char *spec, char *buf, size_t n);
/* 1 when two strings name the same blocks ("" being GPT-2's), else 0. */
int dt_blocks_same(const char *a, const char *b);
/* GPT-2's layer, the default. */
extern const char dt_blocks_gpt2[];

#endif
