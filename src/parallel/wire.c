/* Gradients in the wire's precision. See wire.h. */
#include "parallel/wire.h"

#include <string.h>

#include "core/alloc.h"
#include "kernels/cast.h"

static size_t type_size(dt_dtype t) { return t == DT_BF16 ? sizeof(uint16_t) : sizeof(float); }

int dt_wire_open(dt_wire *w, dt_gbuf g, size_t n, dt_dtype type)
{
    memset(w, 0, sizeof *w);
    w->type = type;
    if ((type == DT_BF16) == (g.bf16 != NULL)) {
        w->buf = dt_gbuf_ptr(g);
        return 0;
    }
    if (!(w->buf = dt_alloc_shared(n * type_size(type), DT_MEM_COMM))) return -1;
    w->copy = 1;
    if (type == DT_BF16) {
        dt_cast_f32_to_bf16(w->buf, g.f32, n);
    } else {
        dt_cast_bf16_to_f32(w->buf, g.bf16, n);
    }
    return 0;
}

void dt_wire_result(const dt_wire *w, size_t from, dt_gbuf dst, size_t count)
{
    if (!w->copy) return;
    if (w->type == DT_BF16) {
        dt_cast_bf16_to_f32(dst.f32, (const uint16_t *)w->buf + from, count);
    } else {
        dt_cast_f32_to_bf16(dst.bf16, (const float *)w->buf + from, count);
    }
}

void *dt_wire_at(const dt_wire *w, size_t i) { return (char *)w->buf + i * type_size(w->type); }

void dt_wire_close(dt_wire *w)
{
    if (w->copy) dt_free(w->buf);
    memset(w, 0, sizeof *w);
}
