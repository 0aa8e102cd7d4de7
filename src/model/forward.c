/* Forward of a micro-batch, or of slot k's part as a pipeline stage runs
 * it: the embeddings, each layer's blocks, the head and the loss. See
 * gpt.h. */
#include "core/fault.h"
#include "core/str.h"
#include "model/model_internal.h"

static int check_tokens(dt_gpt *m, const int32_t *tokens, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size) {
            dt_strf(m->error, sizeof m->error,
                    "model: %s %d at position %zu is outside the vocabulary [0, %d)", what,
                    tokens[i], i, m->cfg.vocab_size);
            return -1;
        }
    }
    return 0;
}

static int check_slot(dt_gpt *m, int k, int b, int t)
{
    const dt_gpt_acts *a = &m->acts;
    if (a->mem && k >= 0 && k < a->nslots && b > 0 && t > 0 && b <= a->B && t <= a->T)
        return 0;
    return dt_strf(m->error, sizeof m->error, "model: forward of %d x %d in slot %d exceeds "
                   "the arena (%d slots of %d x %d)", b, t, k, a->nslots, a->B, a->T), -1;
}

/* The part's layers from its input (the embeddings' output, or what the
 * stage before sent) in the bound slot. */
static const float *run_layers(dt_gpt *m, const dt_gpt_slot *st, int b, int t)
{
    const float *x = m->acts.encoded;
    for (int l = st->part.l0; l < st->part.l1; l++) {
        if (dt_model_need(m, 1 + l, DT_USE_FORWARD) || dt_model_layer_forward(m, l, x, b, t))
            return NULL;
        dt_model_done(m, 1 + l, DT_USE_FORWARD);
        if (l == st->part.l0) dt_fault_point("forward");
        x = dt_model_layer_output(m, l);
    }
    return x;
}

double dt_gpt_forward_slot(dt_gpt *m, int k, const int32_t *tokens, const int32_t *targets,
                           int b, int t)
{
    const int L = m->cfg.n_layer;
    if (check_slot(m, k, b, t)) return -1;
    dt_gpt_slot *st = &m->acts.slots[k];
    const int embed = st->part.l0 == 0, head = st->part.l1 == L;
    if (embed && (!tokens || check_tokens(m, tokens, (size_t)b * t, "token"))) return -1;
    if (head && targets && check_tokens(m, targets, (size_t)b * t, "target")) return -1;
    const int32_t *rows_tokens = tokens, *rows_targets = targets;
    st->tokens = tokens; /* the caller's: backward checks it gets the same */
    if (m->cp.size > 1) {
        const size_t slot = (size_t)k * (size_t)m->acts.B * (size_t)dt_gpt_rows(m, m->acts.T);
        if (dt_model_pick_rows(m, k, tokens, targets, b, t)) return -1;
        rows_tokens = m->cp.tokens + slot;
        rows_targets = targets ? m->cp.targets + slot : NULL;
        t = dt_gpt_rows(m, t);
    }
    st->row_tokens = rows_tokens;
    const int N = b * t;
    dt_gpt_bind_slot(m, k);
    m->acts.rebuilt_layer = -1;
    if (embed) {
        if (dt_model_need(m, 0, DT_USE_FORWARD) || dt_model_embed_forward(m, rows_tokens, b, t))
            return -1;
        dt_model_done(m, 0, DT_USE_FORWARD);
    }
    const float *x = run_layers(m, st, b, t);
    if (!x) return -1;
    st->targets = head ? rows_targets : NULL;
    st->b = b;
    st->t = t;
    if (!head) return 0;
    if (dt_model_head_forward(m, x, N)) return -1;
    if (!targets) return 0;
    return dt_model_head_loss(m, rows_targets, N) / N;
}

double dt_gpt_forward(dt_gpt *m, const int32_t *tokens, const int32_t *targets, int b, int t)
{
    return dt_gpt_forward_slot(m, 0, tokens, targets, b, t);
}
