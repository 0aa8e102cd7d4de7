/* After the layers: the final norm (of the kind of the layer's first
 * norm), the output head (logits = norm(x) @ W^T, W [V, C]: the tokens'
 * table when tied, GPT-2's wte, or the family's lm_head after the final
 * norm) and the
 * cross-entropy, whole or over the vocabulary slices of tensor
 * parallelism (kernels/crossentropy_split.h: no rank ever holds a whole
 * row of logits). See gpt.h. */
#include <string.h>

#include "kernels/crossentropy.h"
#include "kernels/crossentropy_split.h"
#include "model/model_internal.h"

/* The head's segment: 0 (tied to the embedding) or the final norm's. */
static int head_segment(const dt_gpt *m) { return m->head_tensor ? m->cfg.n_layer + 1 : 0; }

static float *head_w(const dt_gpt *m) { return dt_model_tensor_weights(m, m->head_tensor); }

static float *head_g(const dt_gpt *m)
{
    const int s = head_segment(m);
    return dt_model_grads_of(m, s) + (m->tensors[m->head_tensor].offset - dt_gpt_segment_start(m, s));
}

/* The final norm's call on N rows of x, adding to g. */
static void norm_call(dt_gpt *m, const float *x, int N, float *g, dt_block_call *c)
{
    dt_model_block_call(m, &m->final_norm, 0, g, c);
    c->layer = m->cfg.n_layer, c->b = N, c->t = 1, c->N = N;
    c->x = x, c->res = NULL;
    c->a = m->acts.final;
}

int dt_model_head_forward(dt_gpt *m, const float *x, int N)
{
    const int C = m->cfg.n_embd, V = m->tp.vocab, L = m->cfg.n_layer;
    dt_block_call c;
    if (dt_model_need(m, L + 1, DT_USE_FORWARD) || (head_segment(m) == 0 &&
                                                     dt_model_need(m, 0, DT_USE_FORWARD)))
        return -1;
    norm_call(m, x, N, NULL, &c);
    if (m->final_norm.kind->forward(m, &c, DT_RUN_ALL)) return -1;
    if (dt_matmul(m->prec, 0, 1, N, V, C, 1.0f, m->acts.final[0], C, head_w(m), C, 0.0f,
                  m->acts.logits, V))
        return dt_model_fail_matmul(m, "lm_head");
    dt_model_done(m, L + 1, DT_USE_FORWARD);
    if (head_segment(m) == 0) dt_model_done(m, 0, DT_USE_FORWARD);
    return 0;
}

/* The sum of the rows' losses, or -1. Split over the vocabulary, the rows'
 * max and then their sums of exponentials and target logits are reduced
 * over the group; the exponentials stay in the logits' place and the sums
 * in ce_sums, for backward. */
double dt_model_head_loss(dt_gpt *m, const int32_t *targets, int N)
{
    const int V = m->cfg.vocab_size, Vl = m->tp.vocab, v0 = m->tp.v0;
    dt_gpt_acts *a = &m->acts;
    if (m->tp.size == 1) return dt_crossentropy(NULL, a->losses, a->logits, targets, N, V, 0.0f);
    dt_crossentropy_split_max(a->ce_max, a->logits, N, Vl);
    if (dt_model_tp_reduce(m, a->ce_max, (size_t)N, DT_TP_MAX_F32, "loss (max)")) return -1;
    dt_crossentropy_split_sums(a->ce_sums, a->ce_sums + N, a->logits, a->logits, a->ce_max,
                               targets, N, Vl, v0, V);
    if (dt_model_tp_reduce(m, a->ce_sums, 2 * (size_t)N, DT_TP_SUM_F64, "loss (sums)")) return -1;
    return dt_crossentropy_split_losses(a->losses, a->ce_max, a->ce_sums, a->ce_sums + N,
                                        targets, N, V);
}

/* From the loss to d(input of the final norm) in d_res: the logits'
 * gradient in place, the tied head's into wte's (not in an input half: the
 * logits' gradient stays in the slot for the weight half), the norm's. */
int dt_model_head_backward(dt_gpt *m, const dt_gpt_slot *st, const float *lnf_in,
                           float grad_scale, dt_bwd_part what)
{
    const int C = m->cfg.n_embd, V = m->tp.vocab, L = m->cfg.n_layer, N = st->b * st->t;
    dt_gpt_acts *a = &m->acts;
    dt_block_call c;
    /* An input half reads wte but adds nothing to its gradient yet. */
    const int wte_use = what == DT_BWD_INPUT ? DT_USE_FORWARD : DT_USE_BACKWARD;
    if (m->tp.size == 1)
        dt_crossentropy(a->logits, a->losses, a->logits, st->targets, N, V, grad_scale);
    else
        dt_crossentropy_split_backward(a->logits, a->logits, a->ce_sums, st->targets, N, V,
                                       m->tp.v0, m->cfg.vocab_size, grad_scale);
    const int tied = head_segment(m) == 0;
    if (dt_model_need(m, L + 1, DT_USE_BACKWARD) || (tied && dt_model_need(m, 0, wte_use)))
        return -1;
    /* dnorm = dlogits @ W; dW += dlogits^T @ norm's output. */
    if (dt_matmul(m->prec, 0, 0, N, C, V, 1.0f, a->logits, V, head_w(m), C, 0.0f, a->d_c, C) ||
        (what == DT_BWD_WHOLE && dt_matmul(m->prec, 1, 0, V, C, N, 1.0f, a->logits, V,
                                           a->final[0], C, 1.0f, head_g(m), C)))
        return dt_model_fail_matmul(m, "lm_head backward");
    memset(a->d_res, 0, (size_t)N * C * sizeof(float));
    norm_call(m, lnf_in, N, dt_model_grads_of(m, L + 1), &c);
    if (dt_model_input_grad_sum(m, N, "lm_head backward") ||
        m->final_norm.kind->backward(m, &c, what))
        return -1;
    if (tied) dt_model_done(m, 0, wte_use);
    dt_model_done(m, L + 1, DT_USE_BACKWARD);
    return 0;
}

/* The head's weight half: its weight's gradient (the tied head's share
 * of the embedding's). */
int dt_model_head_weights(dt_gpt *m, const dt_gpt_slot *st)
{
    const int C = m->cfg.n_embd, V = m->tp.vocab, N = st->b * st->t;
    if (dt_model_grads_open(m, head_segment(m))) return -1;
    if (dt_matmul(m->prec, 1, 0, V, C, N, 1.0f, m->acts.logits, V, m->acts.final[0], C, 1.0f,
                  head_g(m), C))
        return dt_model_fail_matmul(m, "lm_head backward (weights)");
    return 0;
}
