/* Gradient compression for the parameter server: a worker encodes its
 * gradient before sending it, the server decodes each worker's message into
 * a dense sum.
 *
 * Shapes and contracts:
 * - A message for n floats is exactly dt_compress_bytes(s, n) bytes and
 *   carries no header: sender and receiver derive its size and layout from
 *   the spec and n alone, which both already hold. Buffers need no alignment.
 * - none:  n floats.
 * - topk:  k = dt_compress_topk_k(s, n); k uint32 indices, ascending, then
 *          the k float values at them. n <= 2^32.
 * - int8:  b = ceil(n / 256) blocks of 256 floats (the last one shorter);
 *          b float scales, then n int8 values q; a value decodes to q * scale.
 * - Error feedback: the residual (n floats, zero at the start, kept by the
 *   sender across steps) holds what earlier steps did not send, so nothing
 *   is lost, only delayed; without it topk would never send small
 *   coordinates and int8's rounding would bias every step the same way.
 * - Non-finite inputs (NaN, Inf) never cause a read or write out of bounds
 *   or undefined behaviour; they propagate to the receiver instead of being
 *   hidden, and are not kept in the residual once sent, so one bad step
 *   does not poison every later one:
 *     topk ranks them above every finite magnitude (NaN above Inf), so they
 *     are among the first sent as is;
 *     int8 sends a block holding one with scale NaN and q = 0, so that whole
 *     block decodes to NaN, and resets the block's residual to zero.
 */
#ifndef DT_PARALLEL_COMPRESS_H
#define DT_PARALLEL_COMPRESS_H

#include <stddef.h>

typedef enum { DT_COMPRESS_NONE = 0, DT_COMPRESS_TOPK, DT_COMPRESS_INT8 } dt_compress_kind;

typedef struct {
    dt_compress_kind kind;
    double ratio; /* topk: share of entries kept, (0,1] */
} dt_compress_spec;

/* "none", "topk:R" (0 < R <= 1, e.g. topk:0.01), "int8", as a user writes
 * them in a configuration. 0, or -1 with a message naming the bad text and
 * what is accepted. */
int dt_compress_parse(const char *text, dt_compress_spec *out, char *err, size_t errlen);

/* The canonical text, which dt_compress_parse reads back to the same spec
 * (the ratio with the fewest digits that round-trip, so logs show
 * "topk:0.01"). */
void dt_compress_format(const dt_compress_spec *s, char *buf, size_t len);

/* A pure function of spec and n, so sender and receiver agree without a
 * header. none: 4n; topk: 8k; int8: 4 ceil(n/256) + n. */
size_t dt_compress_bytes(const dt_compress_spec *s, size_t n);

/* topk: max(1, ceil(ratio * n)) capped at n (0 for n = 0). The product is
 * forgiven the double rounding of a decimal ratio (0.07 * 100 is
 * 7.000000000000001 in double, and keeps 7, not 8). Other kinds: n. */
size_t dt_compress_topk_k(const dt_compress_spec *s, size_t n);

/* x = g + residual; out = encode(x); residual = x - decode(out). With
 * residual NULL there is no feedback: x = g and what is not sent is lost.
 * topk keeps the k largest |x|, ties to the lower index, so every rank
 * picks the same entries; sent entries leave a residual of exactly 0 and
 * unsent ones keep x exactly, so decode + residual == x bit for bit. Linear
 * time (a radix select on the magnitudes' bits, no sort); no allocation. */
void dt_compress_encode(const dt_compress_spec *s, const float *g, float *residual, size_t n,
                        void *out);

/* acc[i] += decode(in)[i] for the n floats: the server sums workers'
 * messages straight into one dense buffer. A topk index >= n, which only a
 * corrupt message holds, is skipped rather than written. */
void dt_compress_decode_add(const dt_compress_spec *s, const void *in, size_t n, float *acc);

#endif
