/* Backward of slot k's part: whole, or in the two halves a zero-bubble
 * schedule runs (gpt.h: dt_gpt_backward_part). Each segment's gradients
 * are opened before the first write, folded and reported once this
 * backward is through with them (segment.c). */
#include <string.h>

#include "core/str.h"
#include "model/model_internal.h"

static int check_backward(dt_gpt *m, int k, const float *d_out, dt_bwd_part what)
{
    const dt_gpt_slot *st = k >= 0 && k < m->acts.nslots ? &m->acts.slots[k] : NULL;
    if ((!m->grads && !m->accum.grads16 && !m->grad_slots) || !m->accum.zero || !st || !st->b ||
        (what != DT_BWD_WEIGHTS && (st->part.l1 == m->cfg.n_layer ? !st->targets : !d_out)))
        return dt_strf(m->error, sizeof m->error, "model: backward needs gradients "
                       "(dt_gpt_alloc_grads), a forward in slot %d, and its targets or the "
                       "output's gradient", k), -1;
    if (what != DT_BWD_WHOLE && !m->acts.split)
        return dt_strf(m->error, sizeof m->error, "model: a split backward needs slots carved "
                       "with split_backward"), -1;
    if ((what == DT_BWD_WEIGHTS) != st->weights_pending)
        return dt_strf(m->error, sizeof m->error, "model: slot %d: %s", k, st->weights_pending
                       ? "the weight half of its backward is still to run"
                       : "the weight half of a backward needs its input half first"), -1;
    return 0;
}

/* Layer l's input in the bound slot: the layer before's output, or the part's input. */
static const float *layer_input(const dt_gpt *m, const dt_gpt_slot *st, int l)
{
    return l > st->part.l0 ? dt_model_layer_output(m, l - 1) : m->acts.encoded;
}

/* The input half (or the whole) of slot k's backward: from the loss or
 * d_out down to the part's input. */
static int backward_input(dt_gpt *m, dt_gpt_slot *st, const float *d_out, float grad_scale,
                          dt_bwd_part what)
{
    const int C = m->cfg.n_embd, L = m->cfg.n_layer, N = st->b * st->t;
    const int whole = what == DT_BWD_WHOLE, embed = st->part.l0 == 0;
    if (st->part.l1 == L) {
        if (dt_model_head_backward(m, st, layer_input(m, st, L), grad_scale, what)) return -1;
        dt_model_segment_close(m, L + 1);
        if (whole) dt_model_segment_report(m, L + 1);
        if (whole && !embed && dt_gpt_tied(&m->cfg))
            dt_model_segment_done(m, 0); /* a tied copy: its part is final */
    } else {
        memcpy(m->acts.d_res, d_out, (size_t)N * C * sizeof(float));
    }
    for (int l = st->part.l1 - 1; l >= st->part.l0; l--) {
        if (dt_model_need(m, 1 + l, DT_USE_BACKWARD) ||
            dt_model_layer_backward(m, l, layer_input(m, st, l), st->b, st->t, what))
            return -1;
        dt_model_done(m, 1 + l, DT_USE_BACKWARD);
        dt_model_segment_close(m, 1 + l);
        if (whole) dt_model_segment_report(m, 1 + l);
    }
    st->input_grad_apart = !whole;
    if (!whole || !embed) {
        memcpy(whole ? m->acts.encoded : m->acts.dinput, m->acts.d_res,
               (size_t)N * C * sizeof(float));
        return 0;
    }
    return dt_model_embed_backward(m, m->acts.d_res, st);
}

/* The weight half of slot k's backward; reports each segment in the order
 * the whole backward does. Layers are rebuilt (in a recompute mode) from
 * inputs the slot still holds. */
static int backward_weights(dt_gpt *m, dt_gpt_slot *st)
{
    const int L = m->cfg.n_layer, embed = st->part.l0 == 0;
    if (st->part.l1 == L) {
        if (dt_model_head_weights(m, st)) return -1;
        dt_model_segment_done(m, L + 1); /* an untied head's gradient lands here */
        if (!embed && dt_gpt_tied(&m->cfg)) dt_model_segment_done(m, 0);
    }
    for (int l = st->part.l1 - 1; l >= st->part.l0; l--) {
        /* The weights are read only to rebuild the layer. */
        const int rebuild = m->acts.recompute != DT_RECOMPUTE_NONE;
        if (rebuild && dt_model_need(m, 1 + l, DT_USE_BACKWARD)) return -1;
        if (!rebuild && dt_model_grads_open(m, 1 + l)) return -1;
        if (dt_model_layer_weights(m, l, layer_input(m, st, l), st->b, st->t)) return -1;
        if (rebuild) dt_model_done(m, 1 + l, DT_USE_BACKWARD);
        dt_model_segment_done(m, 1 + l);
    }
    if (!embed) return 0;
    return dt_model_embed_backward(m, m->acts.dinput, st);
}

int dt_gpt_backward_part(dt_gpt *m, int k, const float *d_out, float grad_scale,
                         dt_bwd_part what)
{
    if (check_backward(m, k, d_out, what)) return -1;
    dt_gpt_slot *st = &m->acts.slots[k];
    dt_gpt_bind_slot(m, k);
    m->moe.grad_scale = grad_scale; /* the balance losses weigh their terms by it */
    if (what == DT_BWD_WEIGHTS ? backward_weights(m, st)
                               : backward_input(m, st, d_out, grad_scale, what))
        return -1;
    st->weights_pending = what == DT_BWD_INPUT;
    if (what != DT_BWD_INPUT) st->b = 0;
    return 0;
}

int dt_gpt_backward_slot(dt_gpt *m, int k, const float *d_out, float grad_scale)
{
    return dt_gpt_backward_part(m, k, d_out, grad_scale, DT_BWD_WHOLE);
}

int dt_gpt_backward(dt_gpt *m, const int32_t *tokens, int b, int t, float grad_scale)
{
    const dt_gpt_slot *st = m->acts.nslots > 0 ? &m->acts.slots[0] : NULL;
    if (st && st->b && (tokens != st->tokens || b != st->b || dt_gpt_rows(m, t) != st->t))
        return dt_strf(m->error, sizeof m->error,
                       "model: backward of %d x %d does not match the last forward (%d x %d, "
                       "other tokens?)", b, t, st->b, st->t * m->cp.size), -1;
    return dt_gpt_backward_slot(m, 0, NULL, grad_scale);
}
