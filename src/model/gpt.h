/* The model: its configuration, the flat parameter layout, the buffers,
 * and forward/backward of a micro-batch on the CPU kernels.
 *
 * A layer is a sequence of blocks chosen by data (model/block.h: a norm
 * and the branch it feeds, twice for GPT-2); the embeddings come before
 * the layers, and a final norm and the tied output head after them.
 * Parameters live in one flat buffer, ordered layer-major in forward order
 * (wte, wpe, h.0.*, ..., h.{L-1}.*, ln_f.*), each tensor starting on a
 * 64-byte boundary. Gradients use the same layout, so a gradient bucket, a
 * ZeRO shard, a pipeline stage or a checkpoint shard is a contiguous range.
 * Shapes and names are Hugging Face GPT-2's (linear weights [in, out]).
 *
 * The files: layout.c (the tensor table, segments, the cuts), buffers.c
 * (allocation), segment.c (the protocol a strategy hooks: each segment's
 * parameters around their use, its gradients when final), init.c,
 * embed.c, head.c, forward.c, backward.c, acts.c (the arena), block_ops.c
 * (the group sums tensor parallelism needs), blocks/ (the kinds). */
#ifndef DT_MODEL_GPT_H
#define DT_MODEL_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "core/slot_pool.h"
#include "kernels/matmul.h"
#include "model/acts.h"
#include "model/arch.h"
#include "model/block.h"
#include "model/gbuf.h"
#include "model/moe.h"
#include "model/ranges.h"
#include "model/split.h"

/* Room for a tensor's name ("model.layers.125.post_attention_layernorm.weight")
 * and for a layer's blocks string. */
enum { DT_TENSOR_NAME_MAX = 64, DT_BLOCKS_MAX = 160 };

struct dt_gpt_config {
    int n_layer;
    int n_head;
    int n_embd;
    int vocab_size;
    int block_size; /* the longest sequence: rows of wpe */
    char blocks[DT_BLOCKS_MAX]; /* a layer's blocks (dt_blocks_parse); "": the family's */
    dt_moe_config moe; /* a moe branch's experts and routing (model/moe.h) */
    /* The family (model/arch.h) and what only the Llama family sets. */
    int arch;          /* dt_arch_kind: DT_ARCH_GPT2 (0) or DT_ARCH_LLAMA */
    int n_kv_head;     /* grouped-query attention's key/value heads; 0: n_head */
    int ffn;           /* SwiGLU's hidden width; 0: the family's default (dt_gpt_ffn) */
    double rope_theta; /* rotary embeddings' base; 0: 10000 */
    double norm_eps;   /* RMSNorm's epsilon; 0: 1e-5 */
    int tie;           /* the head is the embedding (GPT-2: always) */
};

/* One named tensor of the flat layout. Under tensor parallelism it holds
 * a slice of Hugging Face's tensor of shape gshape: rows [row0, row0 +
 * rows) of it, and of each such row nblk blocks of cols / nblk columns,
 * block k from column col0 + k * cstride (rows, cols: shape, a 1-D tensor
 * being one row). Unsplit, the slice is the whole tensor. */
typedef struct {
    char name[DT_TENSOR_NAME_MAX]; /* Hugging Face's (GPT-2's without "transformer.") */
    size_t offset; /* in floats, from the start of the flat buffer */
    size_t numel;  /* of this rank's slice */
    int ndim;
    int shape[2];  /* this rank's slice; [1] is 0 for a 1-D tensor */
    int decay; /* weight decay applies (tensors of two or more dimensions) */
    int gshape[2];               /* the whole tensor's */
    int row0, nblk, col0, cstride; /* the slice, as above */
    int split;                   /* the ranks of tensor parallelism hold different slices */
    int expert;                  /* an expert of a mixture of experts: under expert parallelism
                                    the ranks of a group hold different ones (or none here) */
    dt_init_rule init;
} dt_param_tensor;

/* Mixed precision (dt_gpt_set_mixed): the working parameters are bf16,
 * params16, 2 bytes each; forward and backward read them widened (exactly:
 * a bf16 value is an fp32 one) into a slot of their own (core/slot_pool.h),
 * one segment at a time, from just before its use to just after: the same
 * pages every step, so no mapping changes while training runs. The model's params hold
 * the fp32 master weights that the optimizer updates and checkpoints
 * save; dt_gpt_sync_working rounds them into params16 once they change. A
 * strategy that shards the parameters (ZeRO) may make params and params16
 * windows of its own before the buffers are allocated. */
typedef struct {
    int on;
    uint16_t *params16;
    float **widened;   /* per segment: its fp32 copy while in use, else NULL */
    dt_slot_pool pool; /* the copies' slots (private: accounted while in use) */
} dt_gpt_mixed;

/* How gradients accumulate over micro-batches. Either way a segment's
 * backward writes into a slot of `pool` (a private slot pool: the same
 * pages every micro-batch, no mapping changed; apart[s] while it is out).
 * In bf16 (dt_gpt_set_grads16): grads16 holds the sums between
 * micro-batches, 2 bytes each, and the model's grads is NULL. The slot
 * holds a segment's sum widened to fp32 just before its backward, which
 * accumulates into it, and is rounded back once the segment is final,
 * before grad_ready. So the sum rounds to bf16 once per micro-batch, as a
 * bf16 buffer does anywhere.
 * In fp32: a backward into a segment whose sum so far is not known to be
 * zero forms that micro-batch's gradient apart, in a zeroed slot, and adds
 * it into grads when the segment is through, before grad_ready (a segment
 * known to be zero is written in grads directly). So the sum is
 * g1 + g2 + ..., each micro-batch's gradient whole and added once, in
 * order: the sum data parallelism's reduction forms from the ranks'
 * gradients, and one process with N micro-batches holds the bits of N
 * ranks of one (a rank-order reduction). The whole tied embedding (head
 * and input terms) is one micro-batch's gradient, so its slot stays from
 * the head's backward to the embeddings'. */
typedef struct {
    int bf16;
    uint16_t *grads16;
    float **apart;          /* per segment: the slot holding this backward's gradient */
    unsigned char *zero;    /* per segment: its accumulated gradient is all zeros */
    dt_slot_pool pool;      /* apart's slots (accounted while held) */
} dt_gpt_accum;

/* What a strategy hooks. Backward calls grad_ready(grad_ctx, lo, hi) as
 * the gradients of floats [lo, hi) become final (a segment: see
 * dt_gpt_segment_start), so data parallelism can start reducing them while
 * backward goes on. A strategy that does not keep every parameter whole
 * (ZeRO-3) is told around each use of a segment's parameters: param_need
 * before the model reads them (or, DT_USE_INIT, writes their initial
 * values), 0 or -1 with a message in m->error; param_done after. With
 * mixed precision the model widens after param_need and drops its widened
 * copy before param_done; at DT_USE_INIT it writes the master params and
 * rounds them into params16 before param_done. In forward the output head
 * uses segments L + 1 and 0 last and backward uses them first, in that
 * order. NULL: the parameters are all in params. */
typedef struct {
    void (*grad_ready)(void *ctx, size_t lo, size_t hi);
    void *grad_ctx;
    int (*param_need)(void *ctx, int segment, int use);
    void (*param_done)(void *ctx, int segment, int use);
    void *param_ctx;
} dt_gpt_hooks;

struct dt_gpt {
    dt_gpt_config cfg;
    dt_precision prec; /* of the matrix products */
    dt_gpt_tp tp;      /* this rank's slice (dt_gpt_set_tp); unsplit by default */
    dt_gpt_cp cp;      /* this rank's rows (dt_gpt_set_cp); whole sequences by default */
    dt_gpt_ep ep;      /* this rank's experts (dt_gpt_set_ep); all of them by default */

    /* The layout. */
    int n_tensors;
    dt_param_tensor *tensors;
    size_t n_params;  /* real parameters, without alignment padding */
    size_t n_floats;  /* length of the flat buffers, padding included */
    size_t seg_align; /* each segment's length is a multiple of this (floats) */
    int n_blocks;     /* a layer's blocks, each with its tensors and buffers */
    dt_block blocks[DT_LAYER_MAX_BLOCKS];
    int layer_tensors;                /* tensors of one layer */
    dt_block final_norm;              /* the head's (ln_f): of the kind of the layer's first
                                         norm; its tensors follow the last layer's */
    int embed_tensors;                /* segment 0's: the tokens' table, and the
                                         positions' unless the family rotates */
    int head_tensor;                  /* the output head's weight: 0 (tied to the
                                         tokens' table) or the layout's last */

    float *params;    /* fp32 training: what forward and backward read; mixed
                         precision: the fp32 master weights */
    float *grads;     /* NULL until dt_gpt_alloc_grads */
    /* Per segment (dt_gpt_set_grad_slots): where its gradients are while
     * strategies hold them in a slot (dt_gpt_grads_hold: ZeRO-2/3's
     * gradients of a micro-batch), from the segment's first value; NULL:
     * at the segment's place in grads. */
    float **grad_slots;
    int *grad_slot_holds; /* the holders of each segment's slot */
    dt_slot_pool grad_pool; /* the slots (communication memory) */
    /* Per segment (dt_gpt_set_param_slots): where its working parameters
     * (fp32, or params16's bf16 with mixed precision) are while a strategy
     * holds them in a slot of its own (ZeRO-3's gathered segments), from
     * the segment's first value; NULL: at the segment's place in params
     * (params16). The strategy sets and clears the entries. */
    void **param_slots;
    dt_gpt_mixed mixed;
    dt_gpt_accum accum;
    dt_gpt_acts acts;
    dt_gpt_hooks hooks;
    /* At DT_USE_INIT, the floats [lo, hi) of the segment whose initial
     * values are drawn: the whole segment, unless param_need narrows it to
     * what the strategy keeps (the rest of params there is left zero). */
    size_t init_lo, init_hi;
    dt_gpt_moe moe;
    char error[256];
};

enum { DT_USE_FORWARD = 0, DT_USE_BACKWARD, DT_USE_INIT };

/* Checks a configuration; returns 0 or -1 with a message naming the field. */
int dt_gpt_config_check(const dt_gpt_config *cfg, char *err, size_t errlen);
/* Number of parameters: V C + T C, L times the layer's blocks', the final
 * norm's (GPT-2: V C + T C + L (12 C^2 + 13 C) + 2 C). */
size_t dt_gpt_param_count(const dt_gpt_config *cfg);
/* One layer's parameters (the whole tensors, by its kinds; GPT-2's
 * 12 C^2 + 13 C), and the final norm's (GPT-2's 2 C). */
size_t dt_gpt_layer_param_count(const dt_gpt_config *cfg);
size_t dt_gpt_final_norm_param_count(const dt_gpt_config *cfg);

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
/* Expert parallelism (dt_gpt_ep) for a layout without buffers: rank
 * `rank` of `size` holds its E / size experts of every moe layer, the
 * others' tensors absent (in the table, no floats). Refuses experts that
 * do not split. The hooks are the caller's to set. 0, or -1 with
 * m->error. */
int dt_gpt_set_ep(dt_gpt *m, int rank, int size);
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
/* The same for rank q of ep ranks of expert parallelism (like's tensor
 * slice kept). */
int dt_gpt_ep_peer_layout(const dt_gpt *like, int q, int ep, dt_gpt *lay, char *err, size_t n);
/* Mixed precision for a layout with bf16 products and no buffers yet (see
 * dt_gpt.mixed). 0, or -1 with m->error. */
int dt_gpt_set_mixed(dt_gpt *m);
/* Gradients accumulated in bf16 (see dt_gpt_accum), for a layout with
 * mixed precision and no buffers yet. A strategy that accumulates the
 * gradients itself (ZeRO-2 and 3 keep a shard) may clear accum.bf16 again
 * and keep the bf16 accumulation in its shard. 0, or -1 with m->error. */
int dt_gpt_set_grads16(dt_gpt *m);
/* Strategies will hold segments' gradients in slots (dt_gpt.grad_slots;
 * core/slot_pool.h: the same pages each step, which peers read through
 * their mapping). 0, or -1 with m->error. */
int dt_gpt_set_grad_slots(dt_gpt *m);
/* A strategy will place segments' working parameters in slots of its own
 * (dt_gpt.param_slots). 0, or -1 with m->error. */
int dt_gpt_set_param_slots(dt_gpt *m);
/* Segment s's gradients from now on in a slot, zeroed by its first holder;
 * several strategies may hold one segment (ZeRO over the data-parallel
 * ranks and over the expert-data-parallel ones each reduce their tensors
 * of it). The last release gives the slot back. 0, or -1 with m->error. */
int dt_gpt_grads_hold(dt_gpt *m, int s);
void dt_gpt_grads_release(dt_gpt *m, int s);
/* The gradients from element `at` of the layout on, to the end of its
 * segment: in the segment's slot while held, else in dt_gpt_grads. What a
 * strategy told of a segment (grad_ready) reads. */
dt_gbuf dt_gpt_grads_at(const dt_gpt *m, size_t at);
/* The accumulated gradients (grads16, or grads in fp32), and zeroing them
 * for a step's first micro-batch. */
dt_gbuf dt_gpt_grads(const dt_gpt *m);
void dt_gpt_zero_grads(dt_gpt *m);
/* The same for floats [lo, hi) only (a pipeline stage's ranges). */
void dt_gpt_zero_grads_range(dt_gpt *m, size_t lo, size_t hi);
/* A strategy zeroed floats [lo, hi) of the accumulated gradients itself
 * (or brought them as zeros): the segments wholly inside are known zero,
 * so the next backward writes into them directly (see dt_gpt_accum). */
void dt_gpt_grads_zeroed(dt_gpt *m, size_t lo, size_t hi);
/* params16 = bf16(params) over floats [lo, hi), rounding to nearest even:
 * after the master weights changed (initialisation, a load, an update). */
void dt_gpt_sync_working(dt_gpt *m, size_t lo, size_t hi);
/* Parameters (zeroed), gradients: for a model built as a layout, or after
 * dt_gpt_create for the gradients. With mixed precision the parameters are
 * params16 (bf16, accounted as parameters) and the master params (fp32,
 * accounted as optimizer state: K = 12 counts them); with bf16 accumulation the
 * gradients are grads16 (accounted as gradients), and grads stays NULL, as
 * it does where a strategy holds the gradients in slots; a buffer a
 * strategy already set is kept. 0, or -1 with m->error. */
int dt_gpt_alloc_params(dt_gpt *m);
int dt_gpt_alloc_grads(dt_gpt *m);
/* GPT-2's initialisation, as each tensor's rule says (dt_init_rule):
 * N(0, 0.02) weights, residual projections scaled by 1/sqrt(2 L), zero
 * biases, unit norm weights; deterministic in seed, and each tensor's
 * values independent of the layout (a stream per tensor). */
void dt_gpt_init_weights(dt_gpt *m, uint64_t seed);

const dt_param_tensor *dt_gpt_find(const dt_gpt *m, const char *name);
/* Forward of a micro-batch of b <= B sequences of t <= T tokens. With
 * targets, the per-token losses are computed and the mean is returned;
 * without, logits are left in m->acts.logits ([b*t, V]) and 0 is returned.
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
int dt_gpt_backward_part(dt_gpt *m, int k, const float *d_out, float grad_scale,
                         dt_bwd_part what);

/* The flat layout in L + 2 segments that backward finishes one at a time:
 * segment 0 the embeddings (wte, wpe), 1 + l layer l, L + 1 the final
 * LayerNorm. Segment k is [start(k), start(k + 1)); start(L + 2) is the
 * buffer's length. Backward completes them from L + 1 down to 0. */
int dt_gpt_segments(const dt_gpt *m);
size_t dt_gpt_segment_start(const dt_gpt *m, int segment);

/* FLOPs of a training step (forward and backward) per token, for MFU: the
 * head's 6 V C and L times the layer's blocks' (dt_block_kind.flops). For
 * GPT-2:
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
/* One layer's share of it, its kinds' (GPT-2's 72 C^2 + 6 T C). */
double dt_gpt_layer_flops_per_token(const dt_gpt_config *cfg, int T);

/* Mixture of experts (model/moe.h): the counts of every layer zeroed;
 * and, with expert_bias, layer l's bias moved by bias_rate toward equal
 * load, given every expert's slots over the whole batch (the same on
 * every rank, so the biases stay the same). */
void dt_gpt_moe_reset(dt_gpt *m);
void dt_gpt_moe_update_bias(dt_gpt *m, int l, const double *load);

#endif
