/* What each thread that calls dt_matmul keeps for itself: a oneDNN stream,
 * the primitives' scratchpad and the bf16 copies of operands. Buffers grow
 * as needed, are counted as activations, and are freed when the thread
 * ends. */
#ifndef DT_KERNELS_MATMUL_WORKSPACE_H
#define DT_KERNELS_MATMUL_WORKSPACE_H

#include <oneapi/dnnl/dnnl.h>
#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"

typedef struct {
    dnnl_stream_t stream;
    void *scratch;
    uint16_t *a16, *b16, *shared16; /* rounded A, B; an operand shared by callers */
    float *a32, *b32;               /* rounded A, B widened back (bf16 emulated) */
    float *c32;                     /* a block of an accumulated sgemm product */
    size_t scratch_bytes, a16_bytes, b16_bytes, shared16_bytes, a32_bytes, b32_bytes, c32_bytes;
} dt_mm_workspace;

/* The calling thread's workspace, created on first use; NULL when memory or
 * the stream cannot be had. */
dt_mm_workspace *dt_mm_thread_workspace(dnnl_engine_t engine);
/* Grows *buf (holding *have bytes) to at least `bytes`, contents not kept,
 * accounted as `kind`; 0, or -1 when out of memory. */
int dt_mm_reserve(void **buf, size_t *have, size_t bytes, dt_mem_kind kind);

#endif
