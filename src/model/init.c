/* The model's initial weights: each tensor by its rule (dt_init_rule, set
 * by its block kind), from a stream of its own, so its values depend on
 * neither the layout before it nor the rank's slice of it. See gpt.h. */
#include <math.h>
#include <string.h>

#include "core/rand.h"
#include "model/model_internal.h"

/* Standard normal by Box-Muller on 53-bit uniforms. */
static double normal01(uint64_t *state)
{
    double u1 = dt_uniform01(state) + 0.5 / 9007199254740992.0; /* (0, 1): log is finite */
    double u2 = dt_uniform01(state);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* N(0, std) values of the whole tensor from its stream, in row-major
 * order; a slice keeps its blocks of the rows it holds (the rows before
 * them are drawn and dropped), so every layout gets the same numbers. */
static void init_normal(const dt_param_tensor *t, float *p, double std, uint64_t *state)
{
    if (!t->split) {
        for (size_t k = 0; k < t->numel; k++) p[k] = (float)(std * normal01(state));
        return;
    }
    const int gcols = t->gshape[1], cols = t->shape[1], bw = cols / t->nblk;
    for (int r = 0; r < t->row0 + t->shape[0]; r++) {
        float *dst = r >= t->row0 ? p + (size_t)(r - t->row0) * cols : NULL;
        for (int c = 0, b = 0; c < gcols; c++) {
            float v = (float)(std * normal01(state));
            while (b < t->nblk && c >= t->col0 + b * t->cstride + bw) b++;
            int c0 = t->col0 + b * t->cstride;
            if (dst && b < t->nblk && c >= c0) dst[b * bw + (c - c0)] = v;
        }
    }
}

static void init_tensor(const dt_gpt *m, int i, float *p, uint64_t seed)
{
    const dt_param_tensor *t = &m->tensors[i];
    /* A stream per tensor: a tensor's values do not depend on the layout before it. */
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull;
    switch (t->init) {
    case DT_INIT_ONE:
    case DT_INIT_ZERO:
        for (size_t k = 0; k < t->numel; k++) p[k] = t->init == DT_INIT_ONE ? 1.0f : 0.0f;
        break;
    case DT_INIT_NORMAL: init_normal(t, p, 0.02, &state); break;
    case DT_INIT_RESIDUAL: init_normal(t, p, 0.02 / sqrt(2.0 * m->cfg.n_layer), &state); break;
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
            (void)dt_model_need(m, seg, DT_USE_INIT);
            size_t lo = dt_gpt_segment_start(m, seg), hi = dt_gpt_segment_start(m, seg + 1);
            memset(m->params + lo, 0, (hi - lo) * sizeof(float));
        }
        init_tensor(m, i, m->params + m->tensors[i].offset, seed);
    }
    if (seg >= 0) dt_model_done(m, seg, DT_USE_INIT);
}
