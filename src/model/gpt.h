/* GPT-2: configuration, the flat parameter layout, and forward/backward of a
 * micro-batch on the CPU kernels.
 *
 * Parameters live in one flat buffer, ordered layer-major in forward order
 * (wte, wpe, h.0.*, ..., h.{L-1}.*, ln_f.*), each tensor starting on a
 * 64-byte boundary. Gradients use the same layout, so a gradient bucket, a
 * ZeRO shard, a pipeline stage or a checkpoint shard is a contiguous range.
 * Shapes and names are Hugging Face GPT-2's (linear weights [in, out]). */
#ifndef DT_MODEL_GPT_H
#define DT_MODEL_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/attention_ring.h"
#include "kernels/matmul.h"
#include "model/gbuf.h"
#include "model/ranges.h"

typedef struct {
    int n_layer;
    int n_head;
    int n_embd;
    int vocab_size;
    int block_size; /* the longest sequence: rows of wpe */
} dt_gpt_config;

/* One named tensor of the flat layout. Under tensor parallelism it holds
 * a slice of Hugging Face's tensor of shape gshape: rows [row0, row0 +
 * rows) of it, and of each such row nblk blocks of cols / nblk columns,
 * block k from column col0 + k * cstride (rows, cols: shape, a 1-D tensor
 * being one row). Unsplit, the slice is the whole tensor. */
typedef struct {
    char name[48]; /* Hugging Face name without the "transformer." prefix */
    size_t offset; /* in floats, from the start of the flat buffer */
    size_t numel;  /* of this rank's slice */
    int ndim;
    int shape[2];  /* this rank's slice; [1] is 0 for a 1-D tensor */
    int decay; /* weight decay applies (tensors of two or more dimensions) */
    int gshape[2];               /* the whole tensor's */
    int row0, nblk, col0, cstride; /* the slice, as above */
    int split;                   /* the ranks of tensor parallelism hold different slices */
} dt_param_tensor;

/* Tensor parallelism (Megatron's): the ranks of a group each hold a slice
 * of every matrix and run the layer's products on it.
 *   attention: c_attn column-parallel (this rank's heads' q, k, v columns),
 *              c_proj row-parallel (the rows of those heads);
 *   MLP:       c_fc column-parallel (columns [r F, (r + 1) F) of 4C),
 *              c_proj row-parallel (the same rows);
 *   wte:       rows [v0, v0 + vocab): the embedding looks up the tokens in
 *              its slice, the head computes the logits of its slice, the
 *              loss never gathers a whole row (kernels/crossentropy_split.h);
 *   the rest (LayerNorms, wpe, the row-parallel biases) whole on every rank.
 * The group sums the row-parallel products' outputs (then adds the bias,
 * once) and, in backward, the gradients of the column-parallel products'
 * inputs: Megatron's g and f. Every rank then holds the same activations
 * between the products, so the whole tensors' gradients are the same on
 * every rank without communication. reduce is set by the strategy that
 * owns the group. */
/* Sequence parallelism (sp, Megatron's, with tp > 1): the regions between
 * the products (the residual stream, the LayerNorms' inputs and
 * statistics) hold only this rank's rows of the micro-batch's B T, rows
 * [rank R, (rank + 1) R) for R = B T / size. Each LayerNorm's output is
 * gathered from the ranks' rows before its column-parallel product, and
 * each row-parallel product's partial output is reduce-scattered to rows
 * instead of all-reduced; backward, the reverse. The same bytes as the
 * all-reduces (one is a reduce-scatter and an all-gather); the LayerNorms'
 * weight gradients, now of this rank's rows, are summed over the group.
 * The gathered LayerNorm outputs are kept as the column-parallel
 * products' inputs, so their weight gradients need no second gather. */
typedef enum {
    DT_TP_SUM_F32,
    DT_TP_MAX_F32,
    DT_TP_SUM_F64,
    DT_TP_GATHER_F32,     /* buf [n]: this rank's n / size at its slot, in place */
    DT_TP_SCATTER_SUM_F32 /* buf [n]: the sum of this rank's slot lands at buf's start */
} dt_tp_op;
typedef struct {
    int rank, size;     /* size 1: unsplit */
    int sp;             /* sequence parallelism (above) */
    int heads, attn;    /* this rank's heads and their width: NH / size, C / size */
    int mlp;            /* its MLP columns F = 4C / size */
    int v0, vocab;      /* its rows of the vocabulary (dt_vocab_slice) */
    /* In place over the group; 0, or -1 with a message in err. */
    int (*reduce)(void *ctx, void *buf, size_t n, dt_tp_op op, char *err, size_t errlen);
    void *ctx;
} dt_gpt_tp;

/* Context parallelism: the ranks of a group each run every layer on their
 * rows of each sequence (dt_seq_shard's positions for this rank), and only
 * attention looks across them, through the hooks below that the strategy
 * owning the group sets (ring attention or Ulysses). A forward still takes
 * whole sequences, b x t: the model picks its rows of the tokens and
 * targets, adds their positions' embeddings, and returns the mean loss of
 * its rows; the arena holds b x t / size rows. Every rank holds the whole
 * parameters, and its gradients are those of its rows' losses alone (the
 * strategy sums them over the group).
 * The hooks see the local sizes of the layer: rows [b, t / size, 3A] of
 * q, k, v for A = the heads' width (C, or C / tp under tensor
 * parallelism) in `heads` heads; out [b, t / size, A]; `saved` is what
 * forward keeps for backward: saved_floats(rows, A, heads) floats. */
typedef struct {
    int rank, size;             /* size 1: whole sequences */
    dt_shard_kind kind;         /* how the sequence is cut (attention_ring.h) */
    int saved_widths;           /* saved is rows x (heads + saved_widths x A) floats */
    int (*forward)(void *ctx, float *out, float *saved, const float *qkv, int b, int t, int A,
                   int heads, char *err, size_t errlen);
    int (*backward)(void *ctx, float *dqkv, const float *dout, const float *qkv,
                    const float *out, const float *saved, int b, int t, int A, int heads,
                    char *err, size_t errlen);
    void *ctx;
    dt_seq_rows rows;           /* the positions of the last forward's rows */
    int32_t *tokens, *targets;  /* [slots][B, T / size]: each slot's tokens and targets (a
                                 * pipeline stage holds several micro-batches at once) */
} dt_gpt_cp;

/* Pointers to one layer's tensors inside a flat buffer (parameters or
 * gradients: the layout is the same). */
typedef struct {
    float *ln1_w, *ln1_b;   /* [C] */
    float *qkv_w, *qkv_b;   /* [C, 3C], [3C] */
    float *proj_w, *proj_b; /* [C, C], [C] */
    float *ln2_w, *ln2_b;   /* [C] */
    float *fc_w, *fc_b;     /* [C, 4C], [4C] */
    float *fcp_w, *fcp_b;   /* [4C, C], [C] */
} dt_gpt_layer;

/* What backward keeps of each layer's forward, and what it rebuilds right
 * before that layer's backward (dt_gpt_backward's per-layer step, so that
 * whatever must happen before a layer's backward also covers it):
 *   NONE       keeps every activation below.
 *   SELECTIVE  keeps the outputs of the matrix products (qkv, att with its
 *              lse, fc) and the residual stream (res2, res3); rebuilds the
 *              element-wise parts: both LayerNorms (with mean and rstd) and
 *              GELU. (Both c_proj products are written in place as residual
 *              sums, res2 and res3: keeping the sum costs what keeping the
 *              product would, and saves re-adding it.)
 *   FULL       keeps only res3, the residual stream leaving each layer (so
 *              each layer's input: the previous res3, or the embeddings);
 *              rebuilds the rest by running the layer's forward again, but
 *              for the MLP's c_proj, whose output backward does not read.
 * What is rebuilt lives in one layer's worth of buffers that all layers
 * share. The numbers are those of NONE, bit for bit: the same kernels run
 * on the same inputs. Sizes: dt_gpt_layer_act_bytes. */
typedef enum { DT_RECOMPUTE_NONE = 0, DT_RECOMPUTE_SELECTIVE, DT_RECOMPUTE_FULL } dt_recompute;

/* "none", "selective", "full" -> *mode; 0, or -1 for any other name. */
int dt_recompute_parse(const char *name, dt_recompute *mode);
const char *dt_recompute_name(dt_recompute mode);

/* Activations of one layer for one micro-batch, kept for backward (or, for
 * what the recompute mode rebuilds, pointing into the shared layer). */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd; /* [N, C], [N], [N] */
    float *qkv;                       /* [N, 3C] */
    float *att, *lse;                 /* [N, C], [B, NH, T] (cp: its `saved`) */
    float *res2;                      /* [N, C]: residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* [N, C], [N], [N] */
    float *fc, *fc_gelu;              /* [N, 4C] each */
    float *res3;                      /* [N, C]: the layer's output */
    /* With split_backward: each product's output gradient, kept from the
     * input-gradient half of a backward to its weight-gradient half. */
    float *d_fcp, *d_proj;            /* [N, C]: of mlp.c_proj, attn.c_proj */
    float *d_fc, *d_qkv;              /* [N, 4C], [N, 3C]: of mlp.c_fc, attn.c_attn */
} dt_gpt_layer_acts;

/* A part of the model that one pipeline stage (or chunk) runs: layers
 * [l0, l1), with the embeddings when l0 == 0 and the final LayerNorm, the
 * tied output head and the loss when l1 == n_layer. The whole model is
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

typedef struct {
    dt_gpt_config cfg;
    dt_precision prec; /* of the matrix products */
    dt_gpt_tp tp;      /* this rank's slice (dt_gpt_set_tp); unsplit by default */
    dt_gpt_cp cp;      /* this rank's rows (dt_gpt_set_cp); whole sequences by default */

    int n_tensors;
    dt_param_tensor *tensors;
    size_t n_params;  /* real parameters, without alignment padding */
    size_t n_floats;  /* length of the flat buffers, padding included */
    float *params;    /* fp32 training: what forward and backward read; mixed
                         precision: the fp32 master weights (see below) */
    float *grads;     /* NULL until dt_gpt_alloc_grads */

    /* Mixed precision (dt_gpt_set_mixed): the working parameters are bf16,
     * params16, 2 bytes each; forward and backward read them widened
     * (exactly: a bf16 value is an fp32 one) into the window wparams, one
     * segment at a time, from just before its use to just after. params
     * holds the fp32 master weights that the optimizer updates and
     * checkpoints save; dt_gpt_sync_working rounds them into params16 once
     * they change. A strategy that shards the parameters (ZeRO) may make
     * params and params16 windows of its own before the buffers are
     * allocated. */
    int mixed;
    uint16_t *params16;
    float *wparams;
    unsigned char *widened; /* per segment: wparams holds it now */

    /* Gradients accumulated in bf16 (dt_gpt_set_grads16): grads16 holds
     * them between micro-batches, 2 bytes each. grads is then a window: a
     * segment's backward accumulates into it in fp32 (the products add in
     * fp32 anyway), widened from grads16 just before and rounded back into
     * grads16 once the segment is final, before grad_ready. So the sum
     * over micro-batches rounds to bf16 once per micro-batch, as a bf16
     * accumulation buffer does anywhere. */
    int accum16;
    uint16_t *grads16;
    unsigned char *gwidened; /* per segment: grads holds it now */

    /* fp32 accumulation over micro-batches: a backward into a segment whose
     * sum so far is not known to be zero forms that micro-batch's gradient
     * apart, in the window gapart (zeroed), and adds it into grads when
     * the segment is through, before grad_ready. So the accumulated sum is
     * g1 + g2 + ..., each micro-batch's gradient whole and added once, in
     * order: the sum data parallelism's reduction forms from the ranks'
     * gradients, and one process with N micro-batches holds the bits of N
     * ranks of one (a rank-order reduction). The whole tied embedding
     * (head and input terms) is one micro-batch's gradient, so its window
     * segment stays from the head's backward to the embeddings'. */
    float *gapart;
    unsigned char *gzero;  /* per segment: its accumulated gradient is all zeros */
    unsigned char *gopen;  /* per segment: gapart holds this backward's gradient */

    /* Activations, sized for B x T once (dt_gpt_alloc_acts, or
     * dt_gpt_alloc_slots for several micro-batches in flight). The
     * pointers below are those of the bound slot. */
    dt_recompute recompute; /* set before dt_gpt_alloc_acts (default NONE) */
    dt_recompute acts_mode; /* the mode the arena was carved for */
    int split_backward;     /* set before allocating slots: each slot can run its
                               backward in two halves (dt_gpt_backward_part) */
    int acts_split;         /* split_backward when the arena was carved */
    int rebuilt_layer;      /* the layer whose rebuilt activations the shared
                               buffers hold now, or -1 */
    int rebuilt_slot;       /* and the slot it belongs to */
    int B, T;
    float *acts_mem;
    size_t acts_floats;
    int nslots, slot;       /* the slots, and the one bound now */
    dt_gpt_slot *slots;
    dt_gpt_layer_acts shared; /* what the recompute mode rebuilds, one layer's worth */
    float *encoded;               /* [N, C]: the part's input (the embeddings' output,
                                     or the activation received from the stage before);
                                     after a whole backward without the embeddings, the
                                     gradient of that input */
    float *dinput;                /* [N, C], with split_backward: the input's gradient
                                     from a split backward (the input stays for the
                                     weights' half, which may rebuild layers from it) */
    dt_gpt_layer_acts *layer_acts; /* [L], those of the bound slot's part */
    float *lnf, *lnf_mean, *lnf_rstd; /* [N, C], [N], [N] */
    float *logits;                /* [N, V] (tp: [N, vocab]); holds its own gradient after
                                     backward (tp: the exponentials after forward) */
    float *losses;                /* [N] */
    float *ce_max;                /* tp: [N] the rows' largest logits */
    double *ce_sums;              /* tp: [2, N] the sums of exponentials, target logits */
    /* Backward scratch, shared by all layers. */
    float *d_res, *d_c, *d_qkv, *d_fc; /* [N,C], [N,C], [N,3C], [N,4C] */
    float *sp_full, *sp_ln;            /* sequence parallelism: [N, C] gathered, [2C] */

    /* The last forward's inputs: backward must be of the same batch. */
    /* Backward calls grad_ready(ctx, lo, hi) as the gradients of floats
     * [lo, hi) become final (a segment: see dt_gpt_segment_start), so data
     * parallelism can start reducing them while backward goes on. */
    void (*grad_ready)(void *ctx, size_t lo, size_t hi);
    void *grad_ready_ctx;
    /* A strategy that does not keep every parameter whole (ZeRO-3) is told
     * around each use of a segment's parameters: param_need before the
     * model reads them (or, DT_USE_INIT, writes their initial values), 0 or
     * -1 with a message in m->error; param_done after. With mixed
     * precision the model widens after param_need and drops its widened
     * copy before param_done; at DT_USE_INIT it writes the master params
     * and rounds them into params16 before param_done. In forward the
     * output head uses segments L + 1 and 0 last and backward uses them
     * first, in that order. NULL: the parameters are all in params. */
    int (*param_need)(void *ctx, int segment, int use);
    void (*param_done)(void *ctx, int segment, int use);
    void *param_ctx;
    size_t seg_align; /* each segment's length is a multiple of this (floats) */

    char error[256];
} dt_gpt;

enum { DT_USE_FORWARD = 0, DT_USE_BACKWARD, DT_USE_INIT };

/* Checks a configuration; returns 0 or -1 with a message naming the field. */
int dt_gpt_config_check(const dt_gpt_config *cfg, char *err, size_t errlen);
/* Number of parameters by the closed formula V C + T C + L (12 C^2 + 13 C) + 2 C. */
size_t dt_gpt_param_count(const dt_gpt_config *cfg);

/* Builds the layout and allocates the parameters (zeroed). 0 or -1. */
int dt_gpt_create(dt_gpt *m, const dt_gpt_config *cfg, dt_precision prec, char *err,
                  size_t errlen);
/* The layout only (tensor table, sizes), params NULL: for a rank that holds
 * a shard of the parameters, not the model. */
int dt_gpt_create_layout(dt_gpt *m, const dt_gpt_config *cfg, dt_precision prec, char *err,
                         size_t errlen);
void dt_gpt_destroy(dt_gpt *m);
/* Re-lays a layout (no buffers yet) so that every segment starts and ends
 * on a multiple of `align` floats (a multiple of 16): ZeRO splits each
 * segment into equal pieces. Tensors keep their order; only the padding
 * after each segment grows. 0, or -1 with m->error. */
int dt_gpt_pad_segments(dt_gpt *m, size_t align);
/* Tensor parallelism (dt_gpt_tp) for a layout without buffers: rank
 * `rank` of `size` holds its slice of every split tensor. Refuses heads
 * or a vocabulary that do not split (naming the sizes and what would
 * work). 0, or -1 with m->error. */
int dt_gpt_set_tp(dt_gpt *m, int rank, int size);
/* Context parallelism (dt_gpt_cp) for a model without activations: rank
 * `rank` of `size` runs its rows of each sequence, cut as `kind` says;
 * saved_widths as dt_gpt_cp says. The hooks are the caller's to set.
 * 0, or -1 with m->error. */
int dt_gpt_set_cp(dt_gpt *m, int rank, int size, dt_shard_kind kind, int saved_widths);
/* The rows per sequence this rank runs of sequences of t: t / cp size. */
int dt_gpt_rows(const dt_gpt *m, int t);
/* Where this rank's slices sit in the whole model's layout `whole` (a
 * layout of the same configuration, unsplit): ranges whose lo, hi are
 * floats of whole's flat buffer and `at` of this one (model/ranges.h),
 * ascending. Writes up to cap ranges to out (out may be NULL to count);
 * returns how many there are. */
int dt_gpt_tp_ranges(const dt_gpt *m, const dt_gpt *whole, dt_flat_range *out, int cap);
/* The layout (no buffers) of rank q of tp ranks of tensor parallelism
 * with like's configuration, precision, padding, recompute mode, sequence
 * and context parallelism: what another rank of like's group holds.
 * 0, or -1 with a message. */
int dt_gpt_peer_layout(const dt_gpt *like, int q, int tp, dt_gpt *lay, char *err, size_t n);
/* Mixed precision for a layout with bf16 products and no buffers yet (see
 * dt_gpt.mixed). 0, or -1 with m->error. */
int dt_gpt_set_mixed(dt_gpt *m);
/* Gradients accumulated in bf16 (see dt_gpt.accum16), for a layout with
 * mixed precision and no buffers yet. A strategy that accumulates the
 * gradients itself (ZeRO-2 and 3 keep a shard) may clear accum16 again
 * and keep the bf16 accumulation in its shard. 0, or -1 with m->error. */
int dt_gpt_set_grads16(dt_gpt *m);
/* The accumulated gradients (grads16, or grads in fp32), and zeroing them
 * for a step's first micro-batch. */
dt_gbuf dt_gpt_grads(const dt_gpt *m);
void dt_gpt_zero_grads(dt_gpt *m);
/* A strategy zeroed floats [lo, hi) of the accumulated gradients itself
 * (or brought them as zeros): the segments wholly inside are known zero,
 * so the next backward writes into them directly (see dt_gpt.gapart). */
void dt_gpt_grads_zeroed(dt_gpt *m, size_t lo, size_t hi);
/* params16 = bf16(params) over floats [lo, hi), rounding to nearest even:
 * after the master weights changed (initialisation, a load, an update). */
void dt_gpt_sync_working(dt_gpt *m, size_t lo, size_t hi);
/* Parameters (zeroed), gradients: for a model built as a layout, or after
 * dt_gpt_create for the gradients. With mixed precision the parameters are
 * params16 (bf16, accounted as parameters) and the master params (fp32,
 * accounted as optimizer state: K = 12 counts them); with accum16 the
 * gradients are grads16 (accounted as gradients) and the window grads; a
 * buffer a strategy already set is kept. 0, or -1 with m->error. */
int dt_gpt_alloc_params(dt_gpt *m);
int dt_gpt_alloc_grads(dt_gpt *m);
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
/* Floats dt_gpt_alloc_acts would take for B x T (in m->recompute's mode),
 * allocating nothing; and dt_gpt_alloc_slots. */
size_t dt_gpt_acts_floats(const dt_gpt *m, int B, int T);
size_t dt_gpt_slots_floats(const dt_gpt *m, int B, int T, int n, const dt_gpt_part *parts);
void dt_gpt_free_acts(dt_gpt *m);
/* Points the activation fields at slot k's buffers. */
void dt_gpt_bind_slot(dt_gpt *m, int k);
/* Slot k's input activation [B*T, C] (where a stage receives it), and its
 * part's output, the last layer's res3 (what a stage sends on); after
 * dt_gpt_backward_slot of a part without the embeddings the input buffer
 * holds the input's gradient (what a stage sends back). */
float *dt_gpt_slot_input(dt_gpt *m, int k);
/* Floats of a stage's input or output on this rank for b sequences of t:
 * its rows of them (context parallelism), 1/tp of those with sequence
 * parallelism, n_embd wide. What a pipeline's stages exchange. */
size_t dt_gpt_boundary_floats(const dt_gpt *m, int b, int t);
const float *dt_gpt_slot_output(dt_gpt *m, int k);

/* Activation bytes of one layer for a micro-batch of B sequences of T
 * tokens, width C, NH heads, in `mode`, all fp32 (4 bytes), N = B T:
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
 * are multiples of 16). */
size_t dt_gpt_layer_act_bytes(dt_recompute mode, int B, int T, int C, int NH, size_t *shared);

/* GPT-2 initialisation: N(0, 0.02) weights, residual projections scaled by
 * 1/sqrt(2 L), zero biases, unit LayerNorm weights; deterministic in seed. */
void dt_gpt_init_weights(dt_gpt *m, uint64_t seed);

const dt_param_tensor *dt_gpt_find(const dt_gpt *m, const char *name);
dt_gpt_layer dt_gpt_layer_view(const dt_gpt *m, float *flat, int layer);

/* Forward of a micro-batch of b <= B sequences of t <= T tokens. With
 * targets, the per-token losses are computed and the mean is returned;
 * without, logits are left in m->logits ([b*t, V]) and 0 is returned.
 * Returns a negative value on failure (message in m->error). */
double dt_gpt_forward(dt_gpt *m, const int32_t *tokens, const int32_t *targets, int b, int t);
/* Backward of the last forward (which had targets), accumulating into
 * m->grads; each token's loss counts with weight grad_scale (1/(tokens in
 * the global batch) for a mean). 0 or -1. */
int dt_gpt_backward(dt_gpt *m, const int32_t *tokens, int b, int t, float grad_scale);

/* The same for slot k's part, as a pipeline stage runs it. Forward: tokens
 * when the part has the embeddings (else the input is in
 * dt_gpt_slot_input), targets when it has the head (the mean loss is
 * returned; 0 otherwise). The slot keeps the pointers until its backward.
 * Backward: d_out is the gradient of the part's output [b*t, C] (NULL for
 * a part with the head, whose gradient starts at the loss); a part without
 * the embeddings leaves its input's gradient in dt_gpt_slot_input. Each
 * segment of the part reports grad_ready once; a part with the head but
 * not the embeddings reports segment 0 (its tied copy of wte) after the
 * head. Negative, or -1, on failure (m->error). */
double dt_gpt_forward_slot(dt_gpt *m, int k, const int32_t *tokens, const int32_t *targets,
                           int b, int t);
int dt_gpt_backward_slot(dt_gpt *m, int k, const float *d_out, float grad_scale);

/* A backward in two halves, as zero-bubble pipeline schedules run it:
 *   DT_BWD_INPUT    the gradient of the part's input (what the stage before
 *                   waits for): the chain through every layer, with the
 *                   LayerNorms' own gradients on the way (element-wise and
 *                   cheap); each product's output gradient stays in the
 *                   slot. The input's gradient is left in
 *                   dt_gpt_slot_input_grad. No grad_ready.
 *   DT_BWD_WEIGHTS  later, the products' weight and bias gradients from
 *                   what the first half kept, and the embeddings'; each
 *                   segment then reports grad_ready as a whole backward
 *                   would. In a recompute mode, each layer is rebuilt again.
 * The same kernels on the same operands as DT_BWD_WHOLE, so the gradients
 * are its bits, whatever runs between the halves (the halves of other
 * micro-batches touch other gradient elements, or the same ones in the
 * same micro-batch order). Needs slots carved with split_backward; the
 * cost is 9 N C floats a layer and N C more per slot. */
typedef enum { DT_BWD_WHOLE = 0, DT_BWD_INPUT, DT_BWD_WEIGHTS } dt_bwd_part;
int dt_gpt_backward_part(dt_gpt *m, int k, const float *d_out, float grad_scale,
                         dt_bwd_part what);
/* Where slot k's last backward left its input's gradient [b*t, C]. */
float *dt_gpt_slot_input_grad(dt_gpt *m, int k);

/* The flat layout in L + 2 segments that backward finishes one at a time:
 * segment 0 the embeddings (wte, wpe), 1 + l layer l, L + 1 the final
 * LayerNorm. Segment k is [start(k), start(k + 1)); start(L + 2) is the
 * buffer's length. Backward completes them from L + 1 down to 0. */
int dt_gpt_segments(const dt_gpt *m);
size_t dt_gpt_segment_start(const dt_gpt *m, int segment);

/* FLOPs of a training step (forward and backward) per token, for MFU:
 *   6 N + 6 L T C,   N = V C + 12 L C^2
 * N counts the weights that take part in matrix products: the classifier
 * (V x C, tied to wte) and each layer's qkv (3 C^2), attention projection
 * (C^2), fc (4 C^2) and fc projection (4 C^2). Each weight costs 2 FLOPs
 * per token forward and 4 backward (input and weight gradients): 6 N.
 * Attention's two products (Q K^T and P V) cost 4 C FLOPs per query-key pair
 * forward and 8 C backward, and under the causal mask a query meets T / 2
 * keys on average (T: the sequence length trained on): 6 L T C.
 * Not counted: embedding lookups, biases, LayerNorm, GELU, softmax, AdamW.
 * llm.c uses the same attention term but all parameters as N (with wpe,
 * biases, LayerNorm): about 1% more at GPT-2 small's size. */
double dt_gpt_flops_per_token(const dt_gpt_config *cfg, int T);

#endif
