/* The segment protocol (gpt.h: dt_gpt_hooks, dt_gpt_accum): around each
 * use of a segment's parameters, the strategy's hooks and mixed
 * precision's widened copy; each segment's gradients opened before a
 * backward writes them, folded into the sum after, and reported final.
 * Every block kind's parameters and gradients pass through here, so a
 * strategy that hooks a segment (ZeRO-3's gathers, DDP's buckets) never
 * needs to know the kinds. */
#include <stdlib.h>

#include "core/alloc.h"
#include "core/fault.h"
#include "core/str.h"
#include "core/window.h"
#include "kernels/cast.h"
#include "model/model_internal.h"

/* What forward and backward read of a segment, from its first value: the
 * parameters, or their widened copy. */
float *dt_model_weights(const dt_gpt *m, int segment)
{
    if (m->mixed.on) return m->mixed.widened[segment];
    if (m->param_slots && m->param_slots[segment]) return m->param_slots[segment];
    return m->params + dt_gpt_segment_start(m, segment);
}

/* Mixed precision: the segment's bf16 working parameters, from its first. */
static const uint16_t *working16(const dt_gpt *m, int segment)
{
    if (m->param_slots && m->param_slots[segment]) return m->param_slots[segment];
    return m->mixed.params16 + dt_gpt_segment_start(m, segment);
}

float *dt_model_tensor_weights(const dt_gpt *m, int tensor)
{
    const int s = dt_model_segment_of(m, tensor);
    return dt_model_weights(m, s) + (m->tensors[tensor].offset - dt_gpt_segment_start(m, s));
}


/* Before a backward's first gradient of a segment lands, a slot to write
 * into (the same pages every micro-batch: dt_gpt_accum): with bf16
 * accumulation the sum so far, widened; with fp32 accumulation onto a sum
 * that is not zero, zeros, to form this micro-batch's gradient apart. */
int dt_model_grads_open(dt_gpt *m, int segment)
{
    size_t lo = dt_gpt_segment_start(m, segment), hi = dt_gpt_segment_start(m, segment + 1);
    if (m->accum.apart[segment] || (!m->accum.bf16 && m->accum.zero[segment])) return 0;
    const size_t bytes = (hi - lo) * sizeof(float);
    float *slot = m->accum.bf16 ? dt_slot_get(&m->accum.pool, bytes)
                                : dt_slot_get_zeroed(&m->accum.pool, bytes);
    if (!slot)
        return dt_strf(m->error, sizeof m->error, "model: out of memory for a "
                       "micro-batch's gradients of a segment (%.1f MiB)",
                       (double)(hi - lo) * 4 / 1048576.0), -1;
    if (m->accum.bf16) dt_cast_bf16_to_f32(slot, m->accum.grads16 + lo, hi - lo);
    m->accum.apart[segment] = slot;
    dt_mem_account(DT_MEM_GRADS, (long long)bytes);
    return 0;
}

/* Where a segment's gradients are written, from its first value: its
 * slot apart, a strategy's slot, or grads (NULL for a model that only
 * runs forward). */
float *dt_model_grads_of(const dt_gpt *m, int segment)
{
    const size_t lo = dt_gpt_segment_start(m, segment);
    if (m->accum.apart && m->accum.apart[segment]) return m->accum.apart[segment];
    if (m->grad_slots && m->grad_slots[segment]) return m->grad_slots[segment];
    return m->grads ? m->grads + lo : NULL;
}

/* The strategy's hooks (gpt.h), and with mixed precision the widened copy
 * of the working parameters, held (and accounted) from just before the use
 * to just after. */
int dt_model_need(dt_gpt *m, int segment, int use)
{
    if (m->hooks.param_need && m->hooks.param_need(m->hooks.param_ctx, segment, use))
        return -1;
    size_t lo = dt_gpt_segment_start(m, segment), hi = dt_gpt_segment_start(m, segment + 1);
    if (use == DT_USE_BACKWARD && dt_model_grads_open(m, segment)) return -1;
    if (!m->mixed.on || use == DT_USE_INIT || m->mixed.widened[segment]) return 0;
    float *w = dt_slot_get(&m->mixed.pool, (hi - lo) * sizeof(float));
    if (!w)
        return dt_strf(m->error, sizeof m->error, "model: out of memory for a segment's "
                       "widened parameters (%.1f MiB)", (double)(hi - lo) * 4 / 1048576.0), -1;
    dt_cast_bf16_to_f32(w, working16(m, segment), hi - lo);
    dt_mem_account(DT_MEM_PARAMS, (long long)((hi - lo) * sizeof(float)));
    m->mixed.widened[segment] = w;
    return 0;
}

void dt_model_done(dt_gpt *m, int segment, int use)
{
    size_t lo = dt_gpt_segment_start(m, segment), hi = dt_gpt_segment_start(m, segment + 1);
    if (m->mixed.on && use == DT_USE_INIT) dt_gpt_sync_working(m, lo, hi);
    if (m->mixed.on && m->mixed.widened[segment]) {
        dt_slot_put(&m->mixed.pool, m->mixed.widened[segment]);
        dt_mem_account(DT_MEM_PARAMS, -(long long)((hi - lo) * sizeof(float)));
        m->mixed.widened[segment] = NULL;
    }
    if (m->hooks.param_done) m->hooks.param_done(m->hooks.param_ctx, segment, use);
}

/* Once this backward (or half) is through with a segment, its slot given
 * back: with bf16 accumulation the sum rounded back into grads16 first;
 * with fp32 the gradient formed apart added into grads. Either way the
 * accumulated sum is no longer known to be zero. */
void dt_model_segment_close(dt_gpt *m, int segment)
{
    size_t lo = dt_gpt_segment_start(m, segment), hi = dt_gpt_segment_start(m, segment + 1);
    float *slot = m->accum.apart[segment];
    m->accum.zero[segment] = 0;
    if (!slot) return;
    if (m->accum.bf16)
        dt_cast_f32_to_bf16(m->accum.grads16 + lo, slot, hi - lo);
    else
        dt_gbuf_accumulate(dt_gpt_grads_at(m, lo), slot, hi - lo, 0);
    dt_slot_put(&m->accum.pool, slot);
    m->accum.apart[segment] = NULL;
    dt_mem_account(DT_MEM_GRADS, -(long long)((hi - lo) * sizeof(float)));
}

/* The segment's gradient of this micro-batch is final. */
void dt_model_segment_report(dt_gpt *m, int segment)
{
    if (m->hooks.grad_ready)
        m->hooks.grad_ready(m->hooks.grad_ctx, dt_gpt_segment_start(m, segment),
                            dt_gpt_segment_start(m, segment + 1));
}

void dt_model_segment_done(dt_gpt *m, int segment)
{
    dt_model_segment_close(m, segment);
    dt_fault_point("backward");
    dt_model_segment_report(m, segment);
}

