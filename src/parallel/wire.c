/* bf16 copies of gradients for the wire. See wire.h. */
#include "parallel/wire.h"

#include "core/alloc.h"
#include "kernels/cast.h"

int dt_wire_narrow(dt_wire16 *w, const float *src, size_t n)
{
    w->buf = dt_alloc(n * sizeof(uint16_t), DT_MEM_COMM);
    if (!w->buf) return -1;
    w->n = n;
    dt_cast_f32_to_bf16(w->buf, src, n);
    return 0;
}

void dt_wire_widen(const dt_wire16 *w, size_t from, float *dst, size_t count)
{
    dt_cast_bf16_to_f32(dst, w->buf + from, count);
}

void dt_wire_free(dt_wire16 *w)
{
    dt_free(w->buf);
    w->buf = NULL;
    w->n = 0;
}
