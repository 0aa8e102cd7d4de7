/* A gradient buffer of either precision: fp32, or bf16 when gradients
 * accumulate in bf16 (--grad-accum-dtype bf16: 2 bytes a parameter instead
 * of 4). Exactly one pointer is set. Arithmetic is fp32 either way: readers
 * widen bf16 a block at a time, writers round once per store. */
#ifndef DT_MODEL_GBUF_H
#define DT_MODEL_GBUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    float *f32;
    uint16_t *bf16;
} dt_gbuf;

/* Blocks widened at a time by the readers below (a multiple of 16). */
#define DT_GBUF_CHUNK 4096

static inline dt_gbuf dt_gbuf_f32(float *p) { return (dt_gbuf){p, NULL}; }
static inline dt_gbuf dt_gbuf_at(dt_gbuf g, size_t i)
{
    return g.f32 ? dt_gbuf_f32(g.f32 + i) : (dt_gbuf){NULL, g.bf16 + i};
}
static inline size_t dt_gbuf_esz(dt_gbuf g) { return g.f32 ? sizeof(float) : sizeof(uint16_t); }
static inline void *dt_gbuf_ptr(dt_gbuf g) { return g.f32 ? (void *)g.f32 : (void *)g.bf16; }

/* g[0..n) in fp32: g itself, or (bf16) widened into scratch, which holds
 * n <= DT_GBUF_CHUNK floats. */
const float *dt_gbuf_view(dt_gbuf g, size_t n, float *scratch);
/* g[0..n) = src (first), or g + src, stored in g's precision. */
void dt_gbuf_accumulate(dt_gbuf g, const float *src, size_t n, int first);
void dt_gbuf_zero(dt_gbuf g, size_t n);

#endif
