/*
 * Ring attention: causal self-attention over a sequence split across the
 * ranks of a communicator (context parallelism). Each rank keeps its query
 * rows; key/value blocks travel round the ring (rank r sends to r+1 and
 * receives from r-1), each rank attending its queries to the block it holds
 * and folding the partial results by log-sum-exp (kernels/attention_ring.h).
 *
 * Shapes, per rank, for B sequences of T positions over N ranks,
 * Tl = T / N rows per sequence on each rank, HS = C / NH:
 *   qkv, dqkv  [B, Tl, 3C]   this rank's rows of GPT-2's c_attn output
 *   out, dout  [B, Tl, C]
 *   lse        [B, NH, Tl]
 * The rows are the positions dt_seq_shard gives this rank (contiguous: one
 * chunk of T/N; zig-zag: chunks r and 2N-1-r of 2N), in that order. Every
 * rank computes every other rank's positions the same way, so only the
 * key/value values travel, never their positions.
 *
 * Overlap: the next key/value block is posted (isend to r+1, irecv from
 * r-1) before the current one is computed on, into a second buffer. In
 * backward the block's dk, dv travel one hop behind it: a rank computes
 * its contribution into a zeroed buffer while the sum of the earlier
 * ranks' contributions arrives, then adds and forwards it; the N-th hop
 * brings each rank the gradient of its own rows.
 *
 * Every rank of the communicator must call with the same sizes. Functions
 * return 0, or -1 with the reason in ra->error (a communication failure
 * quotes dt_comm_error); no call communicates before the sizes are checked,
 * so bad sizes are refused on every rank alike instead of hanging.
 */
#ifndef DT_PARALLEL_RING_ATTENTION_H
#define DT_PARALLEL_RING_ATTENTION_H

#include "dtrain/comm.h"
#include "kernels/attention_ring.h"
#include "parallel/context/seq_split.h"

typedef struct {
    dt_seq_split split; /* the group, the sizes, this rank's positions */
    char error[256];
} dt_ring_attention;

/* Checks the sizes (T a multiple of N, or of 2N for zig-zag; C a multiple
 * of NH) and fills ra; no communication. */
int dt_ring_attention_init(dt_ring_attention *ra, dt_comm *cp, int B, int T, int C, int NH,
                           dt_shard_kind kind);

/* out, lse for this rank's rows (overwritten). */
int dt_ring_attention_forward(dt_ring_attention *ra, float *out, float *lse, const float *qkv);

/* dqkv (overwritten) from dout and the forward's out and lse. */
int dt_ring_attention_backward(dt_ring_attention *ra, float *dqkv, const float *dout,
                               const float *qkv, const float *out, const float *lse);

#endif
