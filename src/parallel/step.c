/* The default pieces of a step, for a rank that holds the whole model:
 * its micro-batches through forward and backward, the norm of its
 * gradients, the optimizer over the whole model. See strategy.h.
 *
 * Step s trains on the global batch of G sequences at training positions
 * first .. first+G-1; block r (dp_index) of B * accum of them is this
 * rank's, and its micro-batch j the j-th block of B within that. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
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

/* Rank 0 of a job that shrank computes the blocks of several
 * data-parallel ranks (S->dp_hosted) and hands the reduction what a
 * rank-order fold of theirs would be by then, (g0 + g1) + g2, each block's
 * gradient formed as its own rank formed it:
 *  - a layer that reduces every micro-batch (ZeRO-2) sums micro-batch j
 *    over the ranks: j's blocks of the hosted ranks run in rank order, the
 *    model forms each apart and adds it (dt_gpt_accum), and only the last
 *    one's backward reports its segments to the layer;
 *  - a layer that reduces once a step sums the ranks' whole gradients:
 *    each hosted rank's micro-batches run in turn, and with accumulation
 *    the sum so far is set aside (hosted_sum) while the next rank's forms
 *    from zero, then added to the last one's as each segment is reported. */
typedef struct {
    void (*report)(void *ctx, size_t lo, size_t hi);
    void *ctx;
    dt_gpt *m;
    const float *sum;
    size_t added; /* floats: every segment must come by once */
} hosted_add;

static void add_hosted_sum(void *ctx, size_t lo, size_t hi)
{
    hosted_add *h = ctx;
    /* The fp32 sums: in the segment's slot while a layer holds one there. */
    dt_gbuf g = dt_gpt_grads_at(h->m, lo);
    if (!g.f32) g = dt_gbuf_f32(h->m->grads + lo);
    dt_gbuf_accumulate(g, h->sum + lo, hi - lo, 0);
    h->added += hi - lo;
    if (h->report) h->report(h->ctx, lo, hi);
}

/* The gradients of the hosted ranks so far into hosted_sum (the first
 * copied, later ones added), and zero again for the next rank's. */
static int set_aside(dt_strategy *S, int first)
{
    dt_gpt *m = S->rank->model;
    if (!S->hosted_sum && !(S->hosted_sum = dt_alloc(m->n_floats * sizeof(float), DT_MEM_GRADS)))
        return dt_strf(S->rank->err, sizeof S->rank->err, "out of memory for the sum of the "
                       "data-parallel blocks this rank computes (%.1f MiB)",
                       (double)m->n_floats * 4 / 1048576.0), -1;
    dt_gbuf_accumulate(dt_gbuf_f32(S->hosted_sum), m->grads, m->n_floats, first);
    dt_gpt_zero_grads(m);
    return 0;
}

/* One micro-batch's backward with the layers' report of each segment
 * as `mode` says: as they set it (0), withheld (1: a hosted block before
 * the last of a reduction), or after the hosted sum is added (2). */
static int backward(dt_strategy *S, float grad_scale, int mode)
{
    dt_rank *r = S->rank;
    dt_gpt *m = r->model;
    const dt_gpt_hooks saved = m->hooks;
    hosted_add add = {saved.grad_ready, saved.grad_ctx, m, S->hosted_sum, 0};
    if (mode == 1) m->hooks.grad_ready = NULL;
    if (mode == 2) m->hooks.grad_ready = add_hosted_sum, m->hooks.grad_ctx = &add;
    int rc = dt_gpt_backward(m, r->inputs, r->B, r->T, grad_scale);
    m->hooks.grad_ready = saved.grad_ready;
    m->hooks.grad_ctx = saved.grad_ctx;
    if (rc) return dt_strf(r->err, sizeof r->err, "%s", m->error), -1;
    if (mode == 2 && add.added != m->n_floats)
        return dt_strf(r->err, sizeof r->err, "backward reported %zu of the %zu gradients, "
                       "so the blocks this rank computes were not all added (a bug)",
                       add.added, m->n_floats), -1;
    return 0;
}

/* Micro-batch j of block v: its sequences, forward, the layers told,
 * backward; its mean loss into *l. */
static int micro(dt_strategy *S, uint64_t first, int v, int j, int tell, int last,
                 float grad_scale, int mode, double *l)
{
    dt_rank *r = S->rank;
    dt_gpt *m = r->model;
    const uint64_t at = first + ((uint64_t)v * (uint64_t)r->accum + (uint64_t)j) * (uint64_t)r->B;
    if (r->batch(r->batch_ctx, at, r->B, r->inputs, r->targets, r->err, sizeof r->err))
        return -1;
    dt_trace_args ta = dt_trace_noargs();
    ta.micro = j;
    ta.layer_lo = 0;
    ta.layer_hi = m->cfg.n_layer - 1;
    uint64_t t0 = dt_trace_now();
    *l = dt_gpt_forward(m, r->inputs, r->targets, r->B, r->T);
    uint64_t t1 = dt_trace_now();
    dt_trace_add(DT_TRACE_COMPUTE, "forward", t0, t1, &ta);
    if (*l < 0) return dt_strf(r->err, sizeof r->err, "%s", m->error), -1;
    if (tell) dt_strategy_before_backward(S, j, last);
    t1 = dt_trace_now();
    if (backward(S, grad_scale, mode)) return -1;
    dt_trace_add(DT_TRACE_COMPUTE, "backward", t1, dt_trace_now(), &ta);
    return 0;
}

int dt_step_local_grads(dt_strategy *S, uint64_t first, double *loss)
{
    dt_rank *r = S->rank;
    const int A = r->accum, H = S->dp_hosted, per_micro = S->reduce_each_micro;
    /* Each token's loss weighs 1 / (tokens of the ranks that sum their
     * gradients): the sum over micro-batches and ranks is the mean (context
     * parallelism: the rank's rows of the sequences). */
    const float grad_scale = dt_strategy_grad_scale(S, r->B, dt_gpt_rows(r->model, r->T), A);
    double *sums = calloc((size_t)H, sizeof *sums);
    if (!sums) return dt_strf(r->err, sizeof r->err, "out of memory"), -1;
    if (!S->grads_kept_zero) dt_gpt_zero_grads(r->model);
    int rc = 0;
    for (int n = 0; n < H * A && rc == 0; n++) {
        const int k = per_micro ? n % H : n / A, j = per_micro ? n / H : n % A;
        const int last_of_rank = j == A - 1 && (per_micro || k == H - 1);
        int mode = 0;
        if (per_micro && k < H - 1) mode = 1;
        if (!per_micro && A > 1 && H > 1 && k == H - 1 && j == A - 1) mode = 2;
        if (!per_micro && A > 1 && k > 0 && j == 0) rc = set_aside(S, k == 1);
        double l = 0;
        if (rc == 0)
            rc = micro(S, first, S->dp_index + k, j, !per_micro || k == 0, last_of_rank,
                       grad_scale, mode, &l);
        sums[k] += l;
    }
    /* Each block's mean, summed in rank order: the loss the ranks bring to
     * the step's mean (strategy.c) is then the same bits as theirs. */
    *loss = 0;
    for (int k = 0; k < H; k++) *loss += sums[k] / A;
    free(sums);
    return rc;
}

float dt_strategy_grad_scale(const dt_strategy *S, int B, int rows, int micro)
{
    /* Products of small integers, exact in float: every layout that weighs
     * the same tokens gets the same scale. */
    return 1.0f / ((float)B * (float)rows * (float)micro * (float)S->grad_ranks);
}

const dt_flat_ranges *dt_strategy_updates(const dt_strategy *S)
{
    return S->shard ? S->shard : S->held;
}

float *dt_strategy_pieces(const dt_strategy *S)
{
    return S->params_in_store ? S->rank->opt->params : S->shard_params;
}

/* NULL for pieces in the optimizer's store: its stream brings them. */
float *dt_strategy_params_at(const dt_strategy *S, const dt_flat_range *q)
{
    if (S->params_in_store) return NULL;
    return S->shard_params ? S->shard_params + q->at : S->rank->model->params + q->lo;
}

dt_gbuf dt_strategy_grads_at(const dt_strategy *S, const dt_flat_range *q)
{
    if (dt_gbuf_ptr(S->shard_grads)) return dt_gbuf_at(S->shard_grads, q->at);
    return dt_gbuf_at(dt_gpt_grads(S->rank->model), q->lo);
}

/* The layout the norm's blocks are cut from: the whole model's, so that
 * every rank has the same blocks whatever part of it it holds (a
 * tensor-parallel rank's vocabulary slice need not be its peers' size). */
static const dt_gpt *block_layout(const dt_strategy *S)
{
    return S->whole ? S->whole : S->rank->model;
}

/* The norm's blocks, DT_NORM_BLOCK floats from each segment's start, all
 * of the layout's in one array: first[s] is segment s's first. */
static size_t *block_index(const dt_gpt *m)
{
    int nseg = dt_gpt_segments(m);
    size_t *first = malloc((size_t)(nseg + 1) * sizeof *first);
    if (!first) return NULL;
    first[0] = 0;
    for (int s = 0; s < nseg; s++) {
        size_t len = dt_gpt_segment_start(m, s + 1) - dt_gpt_segment_start(m, s);
        first[s + 1] = first[s] + (len + DT_NORM_BLOCK - 1) / DT_NORM_BLOCK;
    }
    return first;
}

/* Block sums of floats [lo, hi) of lay (gradients g, from lo's), segment
 * by segment, into their places. A range that starts on a block of its
 * segment and ends on one (or at the segment's end) writes its blocks
 * (ZeRO's pieces are whole blocks, a stage's ranges whole segments);
 * another (a tensor-parallel rank's rows of a slice) adds block by block,
 * since a block may hold the end of one of its ranges and the start of
 * the next, or other ranks' floats. */
/* The segment float x lies in (a tensor-parallel rank's ranges are many
 * and short: each meets one or two segments, found without a scan). */
static int segment_at(const dt_gpt *lay, size_t x)
{
    int lo = 0, hi = dt_gpt_segments(lay) - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (dt_gpt_segment_start(lay, mid) <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static void add_blocks(const dt_gpt *lay, const size_t *first, size_t lo, size_t hi, dt_gbuf g,
                       double *blocks)
{
    for (int s = segment_at(lay, lo);
         s < dt_gpt_segments(lay) && dt_gpt_segment_start(lay, s) < hi; s++) {
        size_t s0 = dt_gpt_segment_start(lay, s), s1 = dt_gpt_segment_start(lay, s + 1);
        size_t a = lo > s0 ? lo : s0, b = hi < s1 ? hi : s1;
        if (a >= b) continue;
        double *out = blocks + first[s] + (a - s0) / DT_NORM_BLOCK;
        if ((a - s0) % DT_NORM_BLOCK == 0 && (b == s1 || (b - s0) % DT_NORM_BLOCK == 0)) {
            dt_norm_blocks(dt_gbuf_at(g, a - lo), b - a, out);
            continue;
        }
        for (size_t x = a; x < b; out++) {
            size_t end = s0 + ((x - s0) / DT_NORM_BLOCK + 1) * DT_NORM_BLOCK;
            double part;
            if (end > b) end = b;
            dt_norm_blocks(dt_gbuf_at(g, x - lo), end - x, &part);
            *out += part;
            x = end;
        }
    }
}

/* Where map range p ends in the rank's own layout. */
static size_t local_end(const dt_flat_range *p)
{
    return p->at + (p->hi - p->lo);
}

/* Range q's block sums (q of the rank's layout, `at` as shard's), at the
 * places its floats have in the whole layout (S->in_whole, ascending in
 * both layouts; *next, the first of its ranges that can meet q, moves on
 * as q does). */
static void range_blocks(const dt_strategy *S, const dt_flat_range *q, const size_t *first,
                         int *next, double *blocks)
{
    dt_gbuf g = dt_strategy_grads_at(S, q);
    const dt_flat_ranges *map = S->in_whole;
    if (!map) {
        add_blocks(S->rank->model, first, q->lo, q->hi, g, blocks);
        return;
    }
    while (*next < map->n && local_end(&map->r[*next]) <= q->lo) ++*next;
    for (int i = *next; i < map->n && map->r[i].at < q->hi; i++) {
        const dt_flat_range *p = &map->r[i];
        size_t a = q->lo > p->at ? q->lo : p->at, end = local_end(p);
        size_t b = q->hi < end ? q->hi : end;
        if (a < b)
            add_blocks(S->whole, first, p->lo + (a - p->at), p->lo + (b - p->at),
                       dt_gbuf_at(g, a - q->lo), blocks);
    }
}

/* The block sums of the gradients this rank owns, zeros elsewhere, added
 * over each norm group, and the total in layout order, as dt_grad_norm
 * over one whole buffer adds them. The blocks are the whole model's, so
 * every rank has the same ones; a block with one owner (any layout that
 * holds whole tensors: ZeRO's pieces, a stage's layers) is summed exactly
 * as one process sums it, so the norm is the same bits for any such
 * layout. A tensor-parallel block holds several ranks' floats: their
 * parts are added, within rounding of one process's sum. */
int dt_step_local_norm(dt_strategy *S, double *norm)
{
    const dt_gpt *m = S->rank->model;
    const dt_flat_ranges *own = S->owned ? S->owned : dt_strategy_updates(S);
    if (!own && S->n_norm_groups == 0) {
        *norm = dt_grad_norm(m, dt_gpt_grads(m));
        return 0;
    }
    dt_rank *r = S->rank;
    const dt_gpt *lay = block_layout(S);
    size_t *first = block_index(lay);
    double *blocks = first ? calloc(first[dt_gpt_segments(lay)], sizeof *blocks) : NULL;
    if (!blocks)
        return free(first), dt_strf(r->err, sizeof r->err, "gradient norm: out of memory"), -1;
    size_t nblocks = first[dt_gpt_segments(lay)];
    int next = 0;
    dt_flat_range whole = {0, m->n_floats, 0};
    for (int i = 0; i < (own ? own->n : 1); i++)
        range_blocks(S, own ? &own->r[i] : &whole, first, &next, blocks);
    int rc = 0;
    for (int k = 0; k < S->n_norm_groups && rc == 0; k++)
        if ((rc = dt_allreduce(S->norm_group[k], blocks, blocks, nblocks, DT_F64, DT_SUM)))
            dt_strf(r->err, sizeof r->err, "gradient norm: %s", dt_comm_error(S->norm_group[k]));
    double sum = 0;
    for (size_t i = 0; i < nblocks; i++) sum += blocks[i];
    free(blocks);
    free(first);
    *norm = sqrt(sum);
    return rc ? -1 : 0;
}

/* The optimizer over the ranges this rank updates; where the model keeps
 * the fp32 parameters, their bf16 working copy follows (a layer that
 * keeps its own pieces rounds them itself, in after_update). */
int dt_step_local_update(dt_strategy *S, double lr, float coef)
{
    dt_rank *r = S->rank;
    dt_gpt *m = r->model;
    const dt_flat_ranges *mine = dt_strategy_updates(S);
    dt_flat_range whole = {0, m->n_floats, 0};
    const int n = mine ? mine->n : 1;
    dt_opt_span *spans = malloc((size_t)n * sizeof *spans);
    if (!spans) return dt_strf(r->err, sizeof r->err, "the update: out of memory"), -1;
    for (int i = 0; i < n; i++) {
        const dt_flat_range *q = mine ? &mine->r[i] : &whole;
        spans[i] = (dt_opt_span){dt_strategy_params_at(S, q), dt_strategy_grads_at(S, q), q->at,
                                 q->lo, q->hi};
    }
    dt_optimizer_begin_step(r->opt);
    int rc = S->defer_update
                 ? dt_optimizer_defer_spans(r->opt, m, spans, n, lr, coef, r->err, sizeof r->err)
                 : dt_optimizer_update_spans(r->opt, m, spans, n, lr, coef, r->err, sizeof r->err);
    for (int i = 0; rc == 0 && !S->shard_params && !S->params_in_store && i < n; i++)
        dt_gpt_sync_working(m, spans[i].lo, spans[i].hi);
    free(spans);
    return rc;
}
