/* Gradients that travel in bf16 (--comm-dtype bf16, DeepSpeed's
 * communication_data_type): a range of the fp32 gradients is rounded into
 * a bf16 copy, the copy is reduced in place, and the reduced values are
 * widened back into the fp32 buffer. Half the bytes on the wire; the sums
 * round to bf16 at every addition, as a bf16 all-reduce does anywhere.
 * The copy is held only while its reduction is in flight (accounted as
 * communication memory). */
#ifndef DT_PARALLEL_WIRE_H
#define DT_PARALLEL_WIRE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint16_t *buf; /* n bf16 values, or NULL */
    size_t n;
} dt_wire16;

/* w = bf16(src[0..n)). 0, or -1 when memory runs out. */
int dt_wire_narrow(dt_wire16 *w, const float *src, size_t n);
/* dst[0..count) = the copy's values [from, from + count), widened. */
void dt_wire_widen(const dt_wire16 *w, size_t from, float *dst, size_t count);
void dt_wire_free(dt_wire16 *w);

#endif
