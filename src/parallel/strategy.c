/* The strategy stack: adding layers, and calling their hooks in order.
 * See strategy.h. */
#include "parallel/strategy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/str.h"
#include "core/trace.h"

/* Hooks that decide one thing for the rank: at most one layer owns each. */
static const struct {
    const char *what;
    size_t off;
} owned_hooks[] = {
    {"run the micro-batches", offsetof(dt_strategy_ops, grads)},
    {"compute the gradient norm", offsetof(dt_strategy_ops, grad_norm)},
    {"update the parameters", offsetof(dt_strategy_ops, update)},
    {"serve instead of training", offsetof(dt_strategy_ops, serve)},
    {"evaluate a batch", offsetof(dt_strategy_ops, eval_loss)},
};

static int has_hook(const dt_strategy_ops *ops, size_t off)
{
    void (*fn)(void);
    memcpy(&fn, (const char *)ops + off, sizeof fn);
    return fn != NULL;
}

void dt_strategy_init(dt_strategy *S, dt_rank *r)
{
    memset(S, 0, sizeof *S);
    S->rank = r;
    S->dp_size = 1;
    S->dp_hosted = 1;
    S->grad_ranks = 1;
    S->compute_streams = 1;
    S->block_ranks = 1;
    S->writes_checkpoints = r->rank == 0;
}

void dt_virtual_blocks(int rank, int size, int vsize, int *first, int *count)
{
    const int extra = vsize > size ? vsize - size : 0;
    *first = rank == 0 ? 0 : rank + extra;
    *count = rank == 0 ? extra + 1 : 1;
}

void dt_strategy_dp_blocks(dt_strategy *S, dt_comm *group)
{
    const int n = dt_comm_size(group), me = dt_comm_rank(group);
    const int vsize = S->rank->vsize > n && group == S->rank->world ? S->rank->vsize : n;
    dt_virtual_blocks(me, n, vsize, &S->dp_index, &S->dp_hosted);
    S->dp_size = vsize;
    S->grad_ranks *= vsize;
}

int dt_strategy_add(dt_strategy *S, const dt_strategy_ops *ops, void *self)
{
    dt_rank *r = S->rank;
    if (S->nlayers == DT_STRATEGY_MAX_LAYERS) {
        if (ops->destroy) ops->destroy(self);
        return dt_strf(r->err, sizeof r->err, "strategy %s: more than %d layers", ops->name,
                       DT_STRATEGY_MAX_LAYERS), -1;
    }
    for (size_t h = 0; h < sizeof owned_hooks / sizeof owned_hooks[0]; h++) {
        for (int i = 0; i < S->nlayers; i++) {
            if (!has_hook(ops, owned_hooks[h].off) || !has_hook(S->layer[i].ops, owned_hooks[h].off))
                continue;
            dt_strf(r->err, sizeof r->err, "strategies %s and %s cannot be combined: both %s",
                    S->layer[i].ops->name, ops->name, owned_hooks[h].what);
            if (ops->destroy) ops->destroy(self);
            return -1;
        }
    }
    S->layer[S->nlayers].ops = ops;
    S->layer[S->nlayers].self = self;
    S->nlayers++;
    return 0;
}

void dt_strategy_name(const dt_strategy *S, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < S->nlayers && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? "+" : "", S->layer[i].ops->name);
    if (S->nlayers == 0) dt_strf(buf, n, "single");
}

/* Calls a hook of every layer that has it, in stack order, until one fails. */
#define EACH(S, hook, ...)                                                                  \
    do {                                                                                    \
        for (int i_ = 0; i_ < (S)->nlayers; i_++) {                                         \
            if (!(S)->layer[i_].ops->hook) continue;                                        \
            int rc_ = (S)->layer[i_].ops->hook((S)->layer[i_].self, ##__VA_ARGS__);         \
            if (rc_ < 0) return rc_;                                                        \
        }                                                                                   \
    } while (0)

/* The layer that owns a hook, or -1. */
static int owner(const dt_strategy *S, size_t off)
{
    for (int i = 0; i < S->nlayers; i++)
        if (has_hook(S->layer[i].ops, off)) return i;
    return -1;
}
#define OWNER(S, hook) owner((S), offsetof(dt_strategy_ops, hook))

/* Padding first, everywhere; then the plans from the top of the stack
 * down, each narrowing what the layers above it left this rank. */
int dt_strategy_plan(dt_strategy *S, dt_gpt *layout, dt_share *share)
{
    EACH(S, relayout, S->rank, layout);
    *share = (dt_share){.model = 1, .opt_lo = 0, .opt_hi = layout->n_floats};
    for (int i = S->nlayers - 1; i >= 0; i--)
        if (S->layer[i].ops->plan && S->layer[i].ops->plan(S->layer[i].self, S->rank, layout, share))
            return -1;
    return 0;
}

int dt_strategy_own(dt_strategy *S, dt_flat_ranges *mine, dt_flat_range **buf)
{
    *buf = NULL;
    if (S->owned) {
        if (!(*buf = malloc((size_t)(mine->n + S->owned->n) * sizeof **buf))) return -1;
        *mine = dt_flat_ranges_within(mine, S->owned, *buf);
    }
    S->owned = mine;
    return 0;
}

int dt_strategy_add_norm_group(dt_strategy *S, dt_comm *group)
{
    if (S->n_norm_groups == DT_STRATEGY_MAX_LAYERS) return -1;
    S->norm_group[S->n_norm_groups++] = group;
    return 0;
}

int dt_strategy_start(dt_strategy *S)
{
    EACH(S, start, S->rank);
    return 0;
}

/* The mean of the loss over the ranks that share the batch. In a job
 * that may shrink, each rank brings the sum of its blocks' losses and the
 * total is divided by the blocks: the same bits as the average of a job
 * of one block a rank, when the sum is in rank order. */
static int mean_loss(dt_strategy *S, double *loss)
{
    if (!S->lockstep) return 0;
    const int blocks = S->rank->vsize > 0;
    if (dt_allreduce(S->lockstep, loss, loss, 1, DT_F64, blocks ? DT_SUM : DT_AVG) == 0) {
        if (blocks) *loss /= S->dp_size;
        return 0;
    }
    return dt_strf(S->rank->err, sizeof S->rank->err, "loss: %s", dt_comm_error(S->lockstep)),
           -1;
}

int dt_strategy_step(dt_strategy *S, long step, uint64_t first, double lr, double *loss,
                     double *norm)
{
    dt_rank *r = S->rank;
    int g = OWNER(S, grads), n = OWNER(S, grad_norm), u = OWNER(S, update);
    EACH(S, begin_step, step);
    int rc = g >= 0 ? S->layer[g].ops->grads(S->layer[g].self, first, loss)
                    : dt_step_local_grads(S, first, loss);
    if (rc) return -1;
    EACH(S, end_grads);
    if (mean_loss(S, loss)) return -1;
    dt_trace_args ta = dt_trace_noargs();
    ta.step = (int)step;
    uint64_t t0 = dt_trace_now();
    rc = n >= 0 ? S->layer[n].ops->grad_norm(S->layer[n].self, norm) : dt_step_local_norm(S, norm);
    if (rc) return -1;
    dt_trace_add(DT_TRACE_COMPUTE, "grad_norm", t0, dt_trace_now(), &ta);
    if (!isfinite(*norm)) {
        dt_strf(r->err, sizeof r->err,
                "step %ld: the gradient norm is %f; stopping before the update (the weights "
                "and the last checkpoint are untouched)",
                step + 1, *norm);
        return -1;
    }
    float coef = dt_clip_coef(*norm, r->grad_clip);
    if (r->before_update) r->before_update(r->update_ctx);
    t0 = dt_trace_now();
    rc = u >= 0 ? S->layer[u].ops->update(S->layer[u].self, lr, coef)
                : dt_step_local_update(S, lr, coef);
    dt_trace_add(DT_TRACE_COMPUTE, "optimizer", t0, dt_trace_now(), &ta);
    if (rc) return rc;
    EACH(S, after_update);
    return 0;
}

void dt_strategy_traffic(dt_strategy *S, double *comm_ms, uint64_t *bytes)
{
    *comm_ms = 0;
    *bytes = 0;
    for (int i = 0; i < S->nlayers; i++) {
        double ms = 0;
        uint64_t b = 0;
        if (!S->layer[i].ops->traffic) continue;
        S->layer[i].ops->traffic(S->layer[i].self, &ms, &b);
        *comm_ms += ms;
        *bytes += b;
    }
}

int dt_strategy_serves(const dt_strategy *S) { return OWNER(S, serve) >= 0; }

int dt_strategy_serve(dt_strategy *S)
{
    int i = OWNER(S, serve);
    return i >= 0 ? S->layer[i].ops->serve(S->layer[i].self) : 0;
}

/* Each layer may narrow the group; once a layer says alone, no other
 * widens it again. */
int dt_strategy_eval_group(dt_strategy *S, int final, dt_comm **group)
{
    *group = S->lockstep;
    int alone = 0;
    for (int i = 0; i < S->nlayers; i++) {
        if (!S->layer[i].ops->eval_group) continue;
        dt_comm *g = *group;
        if (!S->layer[i].ops->eval_group(S->layer[i].self, final, &g)) return 0;
        alone |= g == NULL;
        *group = alone ? NULL : g;
    }
    return 1;
}

int dt_strategy_eval_loss(dt_strategy *S, const int32_t *inputs, const int32_t *targets, int b,
                          double *loss)
{
    int i = OWNER(S, eval_loss);
    dt_rank *r = S->rank;
    if (i >= 0) {
        if (S->layer[i].ops->eval_loss(S->layer[i].self, inputs, targets, b, loss)) return -1;
    } else if ((*loss = dt_gpt_forward(r->model, inputs, targets, b, r->T)) < 0) {
        return dt_strf(r->err, sizeof r->err, "%s", r->model->error), -1;
    }
    EACH(S, eval_reduce, loss);
    return 0;
}

int dt_strategy_before_save(dt_strategy *S)
{
    EACH(S, before_save);
    return 0;
}

int dt_strategy_gather_params(dt_strategy *S)
{
    EACH(S, gather_params);
    return 0;
}

int dt_strategy_end(dt_strategy *S)
{
    EACH(S, end);
    return 0;
}

int dt_strategy_release(dt_strategy *S)
{
    EACH(S, release);
    return 0;
}

int dt_strategy_replicas_identical(dt_strategy *S, uint64_t *hash)
{
    int result = 2;
    for (int i = 0; i < S->nlayers; i++) {
        if (!S->layer[i].ops->replicas_identical) continue;
        int same = S->layer[i].ops->replicas_identical(S->layer[i].self, hash);
        if (same < 0 || same == 0) return same;
        result = 1;
    }
    return result;
}

void dt_strategy_describe(dt_strategy *S, FILE *f)
{
    for (int i = 0; i < S->nlayers; i++)
        if (S->layer[i].ops->describe) S->layer[i].ops->describe(S->layer[i].self, f);
    for (int i = 0; i < S->nlayers; i++)
        if (S->layer[i].ops->describe_lines) S->layer[i].ops->describe_lines(S->layer[i].self, f);
}

void dt_strategy_describe_blocks(const dt_strategy *S, FILE *f, int n)
{
    if (S->dp_size == n) fprintf(f, " x %d ranks (", n);
    else fprintf(f, " x %d blocks (%d ranks: ", S->dp_size, n);
}

void dt_strategy_rank_label(dt_strategy *S, int r, char *buf, size_t n)
{
    for (int i = 0; i < S->nlayers; i++)
        if (S->layer[i].ops->rank_label) S->layer[i].ops->rank_label(S->layer[i].self, r, buf, n);
}

int dt_strategy_mem_plan(dt_strategy *S, int r, dt_rank_mem *out)
{
    if (S->nlayers == 0) {
        *out = (dt_rank_mem){.floats = 0, .copies = 1};
        return 1;
    }
    for (int i = S->nlayers - 1; i >= 0; i--) {
        int rc = S->layer[i].ops->mem_plan ? S->layer[i].ops->mem_plan(S->layer[i].self, r, out)
                                           : 0;
        if (rc) return rc;
    }
    return 0;
}

void dt_strategy_destroy(dt_strategy *S)
{
    for (int i = S->nlayers - 1; i >= 0; i--)
        if (S->layer[i].ops->destroy) S->layer[i].ops->destroy(S->layer[i].self);
    S->nlayers = 0;
    dt_free(S->hosted_sum);
    S->hosted_sum = NULL;
}
