/* The model's initial weights: each tensor by its rule (dt_init_rule, set
 * by its block kind), from a stream of its own, so its values depend on
 * neither the layout before it nor the rank's slice of it. See gpt.h. */
#include <math.h>
#include <string.h>

#include "core/normal.h"
#include "kernels/threads.h"
#include "model/model_internal.h"

/* Element k of the tensor's values on this rank: its place in the whole
 * tensor, row-major (a slice's blocks of rows, gpt.h), and so the number
 * of the stream it takes. */
static uint64_t stream_index(const dt_param_tensor *t, size_t k)
{
    if (!t->split) return k;
    const size_t cols = (size_t)t->shape[1], bw = cols / (size_t)t->nblk;
    const size_t r = k / cols, b = k % cols / bw, j = k % cols % bw;
    return ((uint64_t)t->row0 + r) * (uint64_t)t->gshape[1] + (uint64_t)t->col0 +
           b * (uint64_t)t->cstride + j;
}

/* Elements [k, k + n) whose stream numbers run on from g: N(0, std). */
static void normal_run(float *p, size_t n, uint64_t g, double std, uint64_t state0)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) p[i] = (float)(std * dt_normal_at(state0, g + i));
}

/* How many elements from k, up to end, have consecutive stream numbers:
 * all of them in a whole tensor, to the end of a row's block in a slice. */
static size_t run_length(const dt_param_tensor *t, size_t k, size_t end)
{
    size_t n = end - k;
    if (t->split) {
        const size_t cols = (size_t)t->shape[1], bw = cols / (size_t)t->nblk;
        const size_t left = bw - k % cols % bw;
        if (left < n) n = left;
    }
    return n;
}

/* N(0, std) values of elements [a, b) of the tensor, element k taking the
 * normal number stream_index(k) of its stream: a slice or a shard draws
 * only what it holds, every layout gets the same numbers, and the threads
 * share the work without changing a bit. A run of consecutive numbers is
 * one vector loop (core/normal.h: GPT-2's 124M took 4 s on one thread with
 * libm's log and cos, 0.3 s so). */
static void init_normal(const dt_param_tensor *t, float *p, size_t a, size_t b, double std,
                        uint64_t state0)
{
    const size_t chunk = 16384;
#pragma omp parallel for schedule(static) num_threads(dt_kernels_threads())
    for (size_t c = a; c < b; c += chunk) {
        const size_t end = b - c < chunk ? b : c + chunk;
        for (size_t k = c, n; k < end; k += n) {
            n = run_length(t, k, end);
            normal_run(p + k, n, stream_index(t, k), std, state0);
        }
    }
}

/* Tensor i's elements that fall in floats [lo, hi) of the flat layout. */
static void init_tensor(const dt_gpt *m, int i, size_t lo, size_t hi, uint64_t seed)
{
    const dt_param_tensor *t = &m->tensors[i];
    const size_t a = lo > t->offset ? lo - t->offset : 0;
    const size_t b = hi < t->offset + t->numel ? hi - t->offset : t->numel;
    if (hi <= t->offset || a >= b) return;
    float *p = m->params + t->offset;
    /* A stream per tensor: a tensor's values do not depend on the layout before it. */
    const uint64_t state = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull;
    switch (t->init) {
    case DT_INIT_ONE:
    case DT_INIT_ZERO:
        for (size_t k = a; k < b; k++) p[k] = t->init == DT_INIT_ONE ? 1.0f : 0.0f;
        break;
    case DT_INIT_NORMAL: init_normal(t, p, a, b, 0.02, state); break;
    case DT_INIT_RESIDUAL:
        init_normal(t, p, a, b, 0.02 / sqrt(2.0 * m->cfg.n_layer), state);
        break;
    }
}

void dt_gpt_init_weights(dt_gpt *m, uint64_t seed)
{
    int seg = -1;
    for (int i = 0; i < m->n_tensors; i++) {
        /* Segment by segment, so a strategy that holds a piece of each
         * keeps it and lets the rest go (nothing needs the whole model). */
        if (dt_model_segment_of(m, i) != seg) {
            if (seg >= 0) dt_model_done(m, seg, DT_USE_INIT);
            seg = dt_model_segment_of(m, i);
            const size_t lo = dt_gpt_segment_start(m, seg), hi = dt_gpt_segment_start(m, seg + 1);
            m->init_lo = lo;
            m->init_hi = hi;
            (void)dt_model_need(m, seg, DT_USE_INIT);
            memset(m->params + lo, 0, (hi - lo) * sizeof(float));
        }
        init_tensor(m, i, m->init_lo, m->init_hi, seed);
    }
    if (seg >= 0) dt_model_done(m, seg, DT_USE_INIT);
}
