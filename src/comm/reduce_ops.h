/* Element-wise reductions for every dtype and op, and 16-bit float
 * conversions. Used by the receive-and-reduce paths of every transport. */
#ifndef DT_COMM_REDUCE_OPS_H
#define DT_COMM_REDUCE_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "core/half.h"
#include "dtrain/comm.h"

/* dst[i] = a[i] op b[i] for n elements; dst may alias a or b. DT_AVG
 * reduces as DT_SUM (the division happens once, in dt_reduce_finish_avg).
 * Integer sums and products wrap (two's complement), never overflow UB.
 * bf16/f16 are computed in fp32 and rounded to nearest even. */
void dt_reduce_elems(dt_dtype t, dt_op op, void *dst, const void *a, const void *b, size_t n);
/* The same, for outputs too large to stay in cache: stores bypass it
 * where the CPU allows (f32 sums with AVX-512 today). */
void dt_reduce_elems_stream(dt_dtype t, dt_op op, void *dst, const void *a, const void *b,
                            size_t n);
/* memcpy whose stores bypass the cache (where the CPU allows), for copies
 * too large to be read again from it. */
void dt_copy_stream(void *dst, const void *src, size_t bytes);
/* Outputs from this size up are written past the cache (the two above):
 * while a collective runs, its sources, its outputs and the transport's
 * rings all compete for the last-level cache, so an output of a few MiB
 * is out of it by the time it is read, and its stores are better spared
 * the read the cache would do first. Measured with 2 ranks sharing a
 * 32 MiB L3: 8 MiB all-reduces and all-to-alls 12-20% faster than with
 * the 32 MiB threshold this replaced. */
#define DT_STREAM_MIN ((size_t)4 << 20)
/* x[i] /= divisor, for DT_AVG (integers truncate toward zero). */
void dt_reduce_finish_avg(dt_dtype t, void *x, size_t n, int divisor);

/* The scalar conversions dt_bf16_to_f32, dt_f32_to_bf16, dt_f16_to_f32 and
 * dt_f32_to_f16 are inline, from core/half.h. */

#endif
