/* The model's buffers: the parameters (and mixed precision's bf16 working
 * copy), the gradients (fp32, or bf16 widened a segment at a time), and
 * freeing them. See gpt.h. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/str.h"
#include "kernels/cast.h"
#include "kernels/profile.h"
#include "model/model_internal.h"

int dt_gpt_set_mixed(dt_gpt *m)
{
    if (m->prec != DT_PREC_BF16 || m->params || m->mixed.params16 || m->grads)
        return dt_strf(m->error, sizeof m->error, "model: mixed precision needs bf16 products "
                       "and a layout without buffers"), -1;
    const size_t n = (size_t)dt_gpt_segments(m);
    if (!(m->mixed.widened = calloc(n, sizeof(float *))))
        return dt_strf(m->error, sizeof m->error, "model: out of memory"), -1;
    dt_slot_pool_init(&m->mixed.pool, DT_SLOTS_PRIVATE, DT_MEM_PARAMS);
    m->mixed.on = 1;
    return 0;
}

int dt_gpt_set_grads16(dt_gpt *m)
{
    if (!m->mixed.on || m->grads || m->accum.grads16)
        return dt_strf(m->error, sizeof m->error, "model: bf16 gradient accumulation needs "
                       "mixed precision and a layout without gradients"), -1;
    m->accum.bf16 = 1;
    return 0;
}

int dt_gpt_set_grad_slots(dt_gpt *m)
{
    if (m->grad_slots) return 0;
    const int n = dt_gpt_segments(m);
    if (!(m->grad_slots = calloc((size_t)n, sizeof(float *))) ||
        !(m->grad_slot_holds = calloc((size_t)n, sizeof(int))))
        return dt_strf(m->error, sizeof m->error, "model: out of memory"), -1;
    dt_slot_pool_init(&m->grad_pool, DT_SLOTS_SHARED, DT_MEM_GRADS);
    return 0;
}

int dt_gpt_set_param_slots(dt_gpt *m)
{
    if (m->param_slots) return 0;
    if (!(m->param_slots = calloc((size_t)dt_gpt_segments(m), sizeof(void *))))
        return dt_strf(m->error, sizeof m->error, "model: out of memory"), -1;
    return 0;
}

int dt_gpt_grads_hold(dt_gpt *m, int s)
{
    if (m->grad_slot_holds[s]++) return 0;
    const size_t n = dt_gpt_segment_start(m, s + 1) - dt_gpt_segment_start(m, s);
    float *slot = dt_slot_get_zeroed(&m->grad_pool, n * sizeof(float)); /* backward adds */
    if (!slot) {
        m->grad_slot_holds[s]--;
        return dt_strf(m->error, sizeof m->error, "model: out of memory for a segment's "
                       "gradients (%.1f MiB)", (double)n * 4 / 1048576.0), -1;
    }
    m->grad_slots[s] = slot;
    return 0;
}

dt_gbuf dt_gpt_grads_at(const dt_gpt *m, size_t at)
{
    for (int s = 0; m->grad_slots && s < dt_gpt_segments(m); s++)
        if (m->grad_slots[s] && at >= dt_gpt_segment_start(m, s) && at < dt_gpt_segment_start(m, s + 1))
            return dt_gbuf_f32(m->grad_slots[s] + (at - dt_gpt_segment_start(m, s)));
    return dt_gbuf_at(dt_gpt_grads(m), at);
}

void dt_gpt_grads_release(dt_gpt *m, int s)
{
    if (m->grad_slot_holds[s] == 0 || --m->grad_slot_holds[s]) return;
    dt_slot_put(&m->grad_pool, m->grad_slots[s]);
    m->grad_slots[s] = NULL;
}

dt_gbuf dt_gpt_grads(const dt_gpt *m)
{
    return m->accum.bf16 ? (dt_gbuf){NULL, m->accum.grads16} : dt_gbuf_f32(m->grads);
}

void dt_gpt_grads_zeroed(dt_gpt *m, size_t lo, size_t hi)
{
    for (int s = 0; m->accum.zero && s < dt_gpt_segments(m); s++)
        if (dt_gpt_segment_start(m, s) >= lo && dt_gpt_segment_start(m, s + 1) <= hi)
            m->accum.zero[s] = 1;
}

/* --profile counts the zeroing with the optimizer, whose zero_grad it is
 * in PyTorch's terms. */
void dt_gpt_zero_grads_range(dt_gpt *m, size_t lo, size_t hi)
{
    const uint64_t t0 = dt_prof_begin();
    dt_gbuf g = dt_gpt_grads(m);
    dt_gbuf_zero(dt_gbuf_at(g, lo), hi - lo);
    dt_gpt_grads_zeroed(m, lo, hi);
    dt_prof_end(DT_PROF_OPTIMIZER, t0, 0.0, (double)(hi - lo) * dt_gbuf_esz(g));
}

void dt_gpt_zero_grads(dt_gpt *m) { dt_gpt_zero_grads_range(m, 0, m->n_floats); }

void dt_gpt_sync_working(dt_gpt *m, size_t lo, size_t hi)
{
    if (m->mixed.on && hi > lo)
        dt_cast_f32_to_bf16(m->mixed.params16 + lo, m->params + lo, hi - lo);
}

int dt_gpt_alloc_params(dt_gpt *m)
{
    if (m->mixed.on && !m->mixed.params16 &&
        !(m->mixed.params16 = dt_alloc(m->n_floats * sizeof(uint16_t), DT_MEM_PARAMS)))
        return dt_strf(m->error, sizeof m->error, "model: cannot allocate %zu bf16 parameters "
                       "(%.1f MiB)", m->n_params, (double)m->n_floats * 2 / 1048576.0), -1;
    if (m->params) return 0;
    m->params = dt_alloc(m->n_floats * sizeof(float), m->mixed.on ? DT_MEM_OPTIM : DT_MEM_PARAMS);
    if (m->params) return 0;
    dt_strf(m->error, sizeof m->error, "model: cannot allocate %zu %sparameters (%.1f MiB)",
            m->n_params, m->mixed.on ? "fp32 master " : "", (double)m->n_floats * 4 / 1048576.0);
    return -1;
}

int dt_gpt_create(dt_gpt *m, const dt_gpt_config *cfg, dt_precision prec, char *err,
                  size_t errlen)
{
    if (dt_gpt_create_layout(m, cfg, prec, err, errlen)) return -1;
    if (dt_gpt_alloc_params(m) == 0) return 0;
    dt_strf(err, errlen, "%s", m->error);
    dt_gpt_destroy(m);
    return -1;
}

void dt_gpt_destroy(dt_gpt *m)
{
    free(m->tensors);
    dt_free(m->params);
    dt_free(m->mixed.params16);
    dt_free(m->grads);
    dt_free(m->accum.grads16);
    dt_slot_pool_free(&m->mixed.pool);
    dt_slot_pool_free(&m->accum.pool);
    free(m->accum.apart);
    free(m->mixed.widened);
    dt_slot_pool_free(&m->grad_pool);
    free(m->grad_slots);
    free(m->grad_slot_holds);
    free(m->param_slots);
    free(m->accum.zero);
    dt_gpt_free_acts(m);
    dt_model_moe_free(m);
    memset(m, 0, sizeof *m);
}

int dt_gpt_alloc_grads(dt_gpt *m)
{
    size_t nseg = (size_t)dt_gpt_segments(m);
    if (!m->accum.zero) m->accum.zero = calloc(nseg, 1);
    if (!m->accum.apart && (m->accum.apart = calloc(nseg, sizeof(float *))))
        dt_slot_pool_init(&m->accum.pool, DT_SLOTS_PRIVATE, DT_MEM_GRADS);
    if (!m->accum.zero || !m->accum.apart)
        return dt_strf(m->error, sizeof m->error, "model: out of memory"), -1;
    if (m->accum.bf16) {
        if (!m->accum.grads16 &&
            !(m->accum.grads16 = dt_alloc_shared(m->n_floats * sizeof(uint16_t), DT_MEM_GRADS)))
            return dt_strf(m->error, sizeof m->error, "model: cannot allocate bf16 gradients "
                           "(%.1f MiB)", (double)m->n_floats * 2 / 1048576.0), -1;
        return 0;
    }
    if (m->grads || m->grad_slots) return 0; /* a strategy's slots hold every segment's */
    m->grads = dt_alloc_shared(m->n_floats * sizeof(float), DT_MEM_GRADS);
    if (!m->grads) {
        dt_strf(m->error, sizeof m->error, "model: cannot allocate gradients (%.1f MiB)",
                (double)m->n_floats * 4 / 1048576.0);
        return -1;
    }
    return 0;
}

