/* Gradients as they travel. The wire's precision (--comm-dtype, DeepSpeed's
 * communication_data_type) need not be the one they accumulate in
 * (--grad-accum-dtype): fp32 gradients reduced in bf16 (half the bytes on
 * the wire, each addition rounded to bf16, as a bf16 all-reduce does
 * anywhere), or bf16 ones reduced in fp32. A range is reduced in place
 * when the precisions agree; otherwise a converted copy is reduced and its
 * result converted back. The copy lives only while its reduction is in
 * flight (accounted as communication memory). */
#ifndef DT_PARALLEL_WIRE_H
#define DT_PARALLEL_WIRE_H

#include <stddef.h>

#include "dtrain/comm.h"
#include "model/gbuf.h"

typedef struct {
    void *buf;      /* what the collective works on: the range itself, or the copy */
    dt_dtype type;  /* DT_F32 or DT_BF16 */
    int copy;       /* buf is a converted copy */
} dt_wire;

/* The n gradients at g, ready to travel as `type`. 0, or -1 when memory
 * for the copy runs out. */
int dt_wire_open(dt_wire *w, dt_gbuf g, size_t n, dt_dtype type);
/* dst[0..count) = the wire's values [from, from + count), in dst's
 * precision; nothing to do when the range travelled in place. */
void dt_wire_result(const dt_wire *w, size_t from, dt_gbuf dst, size_t count);
/* The wire's value at index i (for offsets into buf). */
void *dt_wire_at(const dt_wire *w, size_t i);
void dt_wire_close(dt_wire *w);

#endif
