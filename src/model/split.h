/* How a rank's model is cut: tensor parallelism's slices of the matrices
 * (and sequence parallelism's rows between them), context parallelism's
 * rows of each sequence. The strategies that own the groups fill the
 * hooks; the model and its block kinds read the sizes. */
#ifndef DT_MODEL_SPLIT_H
#define DT_MODEL_SPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/attention_ring.h"

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
    int kv_heads;       /* its key/value heads (grouped-query attention): KV / size */
    int mlp;            /* its MLP columns F / size (dt_gpt_ffn: GPT-2's 4C) */
    int v0, vocab;      /* its rows of the vocabulary (dt_vocab_slice) */
    /* In place over the group; 0, or -1 with a message in err. */
    int (*reduce)(void *ctx, void *buf, size_t n, dt_tp_op op, char *err, size_t errlen);
    void *ctx;
} dt_gpt_tp;

/* Expert parallelism (Megatron's): the E experts of every mixture-of-
 * experts layer split over the ranks of a group taken from the data-
 * parallel ones, rank q holding experts [q E / size, (q + 1) E / size);
 * the other tensors are whole on every rank. A layer's routing slots go
 * to the ranks of their experts and come back (the hooks, set by the
 * strategy that owns the group: an all-to-all of counts, then of rows).
 * Every rank of the group runs the same micro-batches in step, each with
 * its own tokens. */
typedef struct {
    int rank, size;      /* size 1: every expert here */
    int e0, experts;     /* this rank's experts [e0, e0 + experts) */
    /* counts: per_peer ints to each rank (send [size][per_peer]), from each. */
    int (*counts)(void *ctx, const int32_t *send, int32_t *recv, int per_peer, char *err,
                  size_t errlen);
    /* rows of `width` floats: send_rows[q] to rank q (consecutive in send,
     * by rank), recv_rows[q] from q (consecutive in recv, by rank); what
     * names the exchange ("moe dispatch", "moe combine") for a timeline.
     * start: return at once, the exchange in flight until rows_wait (one
     * at a time; buffers untouched meanwhile), so the rows already here
     * can be computed while the others travel. */
    int (*rows)(void *ctx, const float *send, const int32_t *send_rows, float *recv,
                const int32_t *recv_rows, int width, const char *what, int start, char *err,
                size_t errlen);
    int (*rows_wait)(void *ctx, char *err, size_t errlen);
    void *ctx;
} dt_gpt_ep;

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
    /* Every rank's `bytes` into recv, in rank order (a mixture of experts'
     * routing looks across the sequence). */
    int (*gather)(void *ctx, const void *send, void *recv, size_t bytes, char *err,
                  size_t errlen);
    dt_seq_rows rows;           /* the positions of the last forward's rows */
    int32_t *tokens, *targets;  /* [slots][B, T / size]: each slot's tokens and targets (a
                                 * pipeline stage holds several micro-batches at once) */
} dt_gpt_cp;

#endif
