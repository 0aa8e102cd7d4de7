/*
 * DeepSpeed-Ulysses attention: causal self-attention over a sequence split
 * across the ranks of a communicator (context parallelism), by trading the
 * sequence split for a head split. One all-to-all gives every rank all T
 * positions of NH/N heads (rank r: heads [r NH/N, (r+1) NH/N)); it runs
 * the ordinary one-process attention (kernels/attention.h) on them, and a
 * second all-to-all brings each rank its own rows of every head's output.
 * Backward is the mirror image: dout to heads, dt_attention_backward, dqkv
 * back to rows.
 *
 * Shapes, per rank, for B sequences of T positions over N ranks,
 * Tl = T / N rows per sequence on each rank, HS = C / NH, Cn = C / N:
 *   qkv, dqkv  [B, Tl, 3C]   this rank's rows of GPT-2's c_attn output
 *   out, dout  [B, Tl, C]
 *   saved      what forward keeps for backward, head-sharded, positions
 *              0..T-1 in order: qkv [B, T, 3Cn], then out [B, T, Cn], then
 *              lse [B, NH/N, T] (dt_ulysses_saved_floats in all)
 * The rows are the positions dt_seq_shard gives this rank (contiguous: one
 * chunk of T/N; zig-zag: chunks r and 2N-1-r of 2N), in that order, as in
 * ring attention, so either algorithm can run on the same sharding.
 *
 * Traffic: each of the four all-to-alls (qkv and out forward, dout and
 * dqkv backward) sends (N-1)/N of the rank's buffer, whatever N is; ring
 * attention instead passes key/value blocks N-1 hops round the ring.
 *
 * Every rank of the communicator must call with the same sizes. Functions
 * return 0, or -1 with the reason in u->error (a communication failure
 * quotes dt_comm_error); init communicates nothing, so bad sizes are
 * refused on every rank alike instead of hanging.
 */
#ifndef DT_PARALLEL_ULYSSES_H
#define DT_PARALLEL_ULYSSES_H

#include <stddef.h>

#include "dtrain/comm.h"
#include "kernels/attention_ring.h"
#include "parallel/context/seq_split.h"

typedef struct {
    dt_seq_split split; /* the group, the sizes, this rank's positions */
    size_t bytes_sent; /* by the last forward and the backward after it */
    char error[256];
} dt_ulysses;

/* Checks the sizes (NH a multiple of N; T a multiple of N, or of 2N for
 * zig-zag; C a multiple of NH) and fills u; no communication. */
int dt_ulysses_init(dt_ulysses *u, dt_comm *cp, int B, int T, int C, int NH, dt_shard_kind kind);

/* Floats of the caller's `saved` buffer: B T (4C / N) + B (NH / N) T. */
size_t dt_ulysses_saved_floats(const dt_ulysses *u);

/* out for this rank's rows (overwritten); fills saved. Restarts
 * bytes_sent. */
int dt_ulysses_forward(dt_ulysses *u, float *out, const float *qkv, float *saved);

/* dqkv (overwritten) from dout and what the forward saved. Adds to
 * bytes_sent. */
int dt_ulysses_backward(dt_ulysses *u, float *dqkv, const float *dout, const float *saved);

#endif
