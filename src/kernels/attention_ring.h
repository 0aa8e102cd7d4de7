/*
 * The compute kernels of ring attention (context parallelism); no
 * communication here. The sequence is split over N ranks: each keeps its
 * query rows, and key/value rows travel round the ring. At every step a
 * rank attends its queries to the key/value rows it holds just then, and
 * folds that partial result into its running one by log-sum-exp; backward
 * sends the key/value gradients round the ring the same way.
 *
 * Which positions a block of rows holds is a dt_seq_rows: one or two
 * chunks of the sequence, the block's rows being chunk 0's positions in
 * order, then chunk 1's. Zig-zag sharding gives a rank two chunks (cut the
 * sequence into 2N, rank r holds chunks r and 2N-1-r) so that every rank
 * has the same causal work; contiguous sharding gives rank r chunk r of N.
 *
 * Shapes, for B sequences, NH heads, HS = C / NH, Tq = query rows of the
 * block (per sequence), Tk = key/value rows:
 *   q  [B, Tq, ldq]:  row t of sequence b at q + (b * Tq + t) * ldq, heads
 *                     side by side, [NH, HS] (q may point into a [B, Tq, 3C]
 *                     qkv buffer: ldq = 3C).
 *   k, v [B, Tk, ldkv]: the same for keys and values (k, v may point into a
 *                     packed [B, Tk, 2C] buffer that travels: ldkv = 2C).
 *   out, dout [B, Tq, C]; lse, D [B, NH, Tq].
 *   dq strided like q (ldq), dk and dv like k and v (ldkv).
 * Causal: a key is seen by a query at the same or a later position. Scale
 * 1/sqrt(HS), as dt_attention_forward. Work goes by blocks of ATTN_BLOCK
 * rows and keys; no Tq x Tk matrix is formed.
 */
#ifndef DT_KERNELS_ATTENTION_RING_H
#define DT_KERNELS_ATTENTION_RING_H

#include <stddef.h>

#define DT_SEQ_MAX_CHUNKS 2

typedef struct {
    int count;                    /* chunks: 1 or 2 */
    int begin[DT_SEQ_MAX_CHUNKS]; /* first position of each chunk */
    int len[DT_SEQ_MAX_CHUNKS];   /* its length */
} dt_seq_rows;

typedef enum { DT_SHARD_CONTIGUOUS, DT_SHARD_ZIGZAG } dt_shard_kind;

/* Positions [begin, begin + len) as one chunk. */
dt_seq_rows dt_seq_span(int begin, int len);
/* The rows of a block: the sum of its chunks' lengths. */
int dt_seq_rows_total(const dt_seq_rows *rows);
/* The positions rank `rank` of N holds of a sequence of T. Returns 0, or
 * -1 (rows->count = 0) when T is not a multiple of N (contiguous) or of 2N
 * (zig-zag), or the rank is out of range. */
int dt_seq_shard(dt_seq_rows *rows, int T, int rank, int N, dt_shard_kind kind);
/* Whether B sequences of T positions, width C in NH heads, shard over N
 * ranks as `kind` says (all positive, C a multiple of NH, T of N or 2N):
 * 0, or -1 with a message in err, begun with `who`, naming the nearest
 * lengths that would work. */
int dt_seq_shard_check(const char *who, int B, int T, int C, int NH, int N, dt_shard_kind kind,
                       char *err, size_t errlen);
/* (query chunk, key chunk) pairs that have some key at or before some
 * query: the block pairs the kernels below compute (a measure of work). */
int dt_seq_pairs_with_work(const dt_seq_rows *q_rows, const dt_seq_rows *kv_rows);

/* Causal attention of the query block to this key/value block alone:
 * out = the partial output, normalised over these keys; lse = its
 * log-sum-exp (-INFINITY, with out 0, for a query that sees no key here).
 * Returns dt_seq_pairs_with_work; when that is 0 (every key after every
 * query) nothing is computed and out and lse are left untouched, so there
 * is nothing to merge. */
int dt_attention_block_forward(float *out, float *lse, const float *q, size_t ldq,
                               const float *k, const float *v, size_t ldkv,
                               const dt_seq_rows *q_rows, const dt_seq_rows *kv_rows, int B,
                               int C, int NH);

/* Folds a partial result (part_out [B, T, C], part_lse [B, NH, T]) into an
 * accumulated one, in place: each is weighted by exp(its lse - new lse).
 * Either lse may be -INFINITY (nothing seen yet / nothing seen in the
 * part); start an accumulation from out = 0, lse = -INFINITY. */
void dt_attention_merge(float *out, float *lse, const float *part_out, const float *part_lse,
                        int B, int T, int C, int NH);

/* D [B, NH, T] = rowsum(dout * out) per (query, head), out [B, T, C] being
 * the final (merged) output: a term of the backward of every block pair. */
void dt_attention_row_dots(float *D, const float *dout, const float *out, int B, int T, int C,
                           int NH);

/* Backward of one block pair, flash style, from the final out's lse and D:
 * P = exp(scale q.k - lse), dv += P^T dout, dP = dout v^T,
 * dS = P (dP - D), dq += scale dS k, dk += scale dS^T q.
 * Adds into dq, dk, dv (zero them before the first pair). Every query must
 * see some key overall (lse finite), as a causal query sees itself.
 * Returns dt_seq_pairs_with_work; when 0, nothing is touched. */
int dt_attention_block_backward(float *dq, float *dk, float *dv, const float *dout,
                                const float *lse, const float *D, const float *q, size_t ldq,
                                const float *k, const float *v, size_t ldkv,
                                const dt_seq_rows *q_rows, const dt_seq_rows *kv_rows, int B,
                                int C, int NH);

#endif
