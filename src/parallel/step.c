/* The default pieces of a step, for a rank that holds the whole model:
 * its micro-batches through forward and backward, the norm of its
 * gradients, the optimizer over the whole model. See strategy.h.
 *
 * Step s trains on the global batch of G sequences at training positions
 * first .. first+G-1; block r (dp_index) of B * accum of them is this
 * rank's, and its micro-batch j the j-th block of B within that. */
#include <math.h>
#include <string.h>

#include "core/str.h"
#include "core/trace.h"
#include "kernels/optimizer.h"
#include "parallel/strategy.h"

void dt_strategy_before_backward(dt_strategy *S, int micro, int last)
{
    for (int i = 0; i < S->nlayers; i++)
        if (S->layer[i].ops->before_backward)
            S->layer[i].ops->before_backward(S->layer[i].self, micro, last);
}

int dt_step_local_grads(dt_strategy *S, uint64_t first, double *loss)
{
    dt_rank *r = S->rank;
    dt_gpt *m = r->model;
    /* Each token's loss weighs 1 / (tokens of this rank's share): the sum
     * over micro-batches is the mean, and averaging over ranks the global one. */
    const float grad_scale = 1.0f / ((float)r->B * (float)r->T * (float)r->accum);
    const uint64_t mine = first + (uint64_t)S->dp_index * (uint64_t)r->B * (uint64_t)r->accum;
    double sum = 0;
    if (!S->grads_kept_zero) dt_gpt_zero_grads(m);
    for (int j = 0; j < r->accum; j++) {
        if (r->batch(r->batch_ctx, mine + (uint64_t)j * (uint64_t)r->B, r->B, r->inputs,
                     r->targets, r->err, sizeof r->err))
            return -1;
        dt_trace_args ta = dt_trace_noargs();
        ta.micro = j;
        ta.layer_lo = 0;
        ta.layer_hi = m->cfg.n_layer - 1;
        uint64_t t0 = dt_trace_now();
        double l = dt_gpt_forward(m, r->inputs, r->targets, r->B, r->T);
        uint64_t t1 = dt_trace_now();
        dt_trace_add(DT_TRACE_COMPUTE, "forward", t0, t1, &ta);
        dt_strategy_before_backward(S, j, j == r->accum - 1);
        t1 = dt_trace_now();
        if (l < 0 || dt_gpt_backward(m, r->inputs, r->B, r->T, grad_scale))
            return dt_strf(r->err, sizeof r->err, "%s", m->error), -1;
        dt_trace_add(DT_TRACE_COMPUTE, "backward", t1, dt_trace_now(), &ta);
        sum += l;
    }
    *loss = sum / r->accum;
    return 0;
}

int dt_step_local_norm(dt_strategy *S, double *norm)
{
    const dt_gpt *m = S->rank->model;
    *norm = dt_grad_norm(m, dt_gpt_grads(m));
    return 0;
}

int dt_step_local_update(dt_strategy *S, double lr, float coef)
{
    dt_rank *r = S->rank;
    dt_gpt *m = r->model;
    dt_optimizer_step(r->opt, m, m->params, dt_gpt_grads(m), 0, m->n_floats, lr, coef);
    dt_gpt_sync_working(m, 0, m->n_floats);
    return 0;
}
