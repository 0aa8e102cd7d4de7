/* ZeRO as a strategy layer: what a rank holds, the step's hooks, and the
 * gradient norm over pieces. See zero.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/str.h"
#include "core/timer.h"
#include "core/window.h"
#include "parallel/fingerprint.h"
#include "parallel/zero/zero_internal.h"

static int failed(zero *z, const char *what)
{
    dt_rank *r = z->S->rank;
    if (z->error) return dt_strf(r->err, sizeof r->err, "ZeRO: %s", z->errmsg), -1;
    return dt_strf(r->err, sizeof r->err, "ZeRO: %s: %s", what, dt_comm_error(z->comm)), -1;
}

static int out_of_memory(zero *z, const char *what)
{
    dt_rank *r = z->S->rank;
    return dt_strf(r->err, sizeof r->err, "ZeRO-%d: cannot allocate %s", z->o.stage, what), -1;
}

/* The layout padded for equal pieces; the buffers this stage does not hold
 * whole become windows; the optimizer's state covers this rank's pieces. */
static int zero_plan(void *self, dt_rank *r, dt_gpt *layout, dt_share *share)
{
    zero *z = self;
    z->m = layout;
    z->L = layout->cfg.n_layer;
    z->mixed = layout->mixed;
    if (dt_gpt_pad_segments(layout, dt_shard_align(r->size)) ||
        dt_shard_map_build(&z->map, layout, r->size, r->rank))
        return out_of_memory(z, "the shard map");
    z->nseg = z->map.nseg;
    z->seg = calloc((size_t)z->nseg, sizeof *z->seg);
    if (!z->seg) return out_of_memory(z, "the segment table");
    size_t bytes = layout->n_floats * sizeof(float);
    if (z->o.prefetch_floats > 0 && z->L > 0) { /* DeepSpeed's prefetch bucket: the layers that fit */
        size_t layer = dt_gpt_segment_start(layout, 2) - dt_gpt_segment_start(layout, 1);
        z->o.prefetch = (int)(z->o.prefetch_floats / layer);
    }
    if (z->o.stage >= 2) {
        /* The shard accumulates over micro-batches, in the precision the
         * model would have (bf16 with --grad-accum-dtype bf16); the model's
         * gradients are one micro-batch's, fp32, in a window. */
        int accum16 = layout->accum16;
        layout->accum16 = 0;
        void *g = dt_alloc(z->map.len * (accum16 ? sizeof(uint16_t) : sizeof(float)), DT_MEM_GRADS);
        z->shard_g = accum16 ? (dt_gbuf){NULL, g} : dt_gbuf_f32(g);
        if (!g || !(layout->grads = dt_window_reserve(bytes)))
            return out_of_memory(z, "the gradient shard");
        z->window_g = 1;
        z->S->grads_kept_zero = 1;
    }
    /* fp32 pieces: stage 3's parameters, or mixed precision's master
     * weights (optimizer state, K = 12 counts them) at every stage. */
    if (z->o.stage >= 3 || z->mixed) {
        z->shard_p = dt_alloc(z->map.len * sizeof(float), z->mixed ? DT_MEM_OPTIM : DT_MEM_PARAMS);
        if (!z->shard_p || !(layout->params = dt_window_reserve(bytes)))
            return out_of_memory(z, "the parameter shard");
        z->window_p = 1;
        z->S->shard_params = z->shard_p;
    }
    if (z->o.stage >= 3 && z->mixed) { /* the bf16 pieces, gathered into a bf16 window */
        z->shard16 = dt_alloc(z->map.len * sizeof(uint16_t), DT_MEM_PARAMS);
        if (!z->shard16 || !(layout->params16 = dt_window_reserve(layout->n_floats * 2)))
            return out_of_memory(z, "the bf16 parameter shard");
        z->window16 = 1;
    }
    for (int s = 0; s < z->nseg && z->o.stage >= 3; s++)
        z->seg[s].persistent = dt_zero_seg_len(z, s) <= z->o.persist_floats;
    layout->param_need = dt_zero_param_need;
    layout->param_done = dt_zero_param_done;
    layout->param_ctx = z;
    share->opt_lo = share->opt_hi = 0;
    z->ranges = dt_shard_map_ranges(&z->map);
    share->opt_ranges = z->ranges;
    z->S->shard = &z->ranges;
    return 0;
}

/* The ranks start from the same weights: stages 1-2 in fp32 take rank 0's;
 * a rank that keeps fp32 pieces (stage 3, mixed precision) keeps its
 * pieces of what the initialisation (piece by piece) or a weights file
 * (whole, in the window) gave, and with mixed precision rounds them into
 * the working copy. */
static int zero_start(void *self, dt_rank *r)
{
    zero *z = self;
    if (!z->shard_p) {
        float *p = z->m->params;
        return dt_broadcast(z->comm, p, p, z->m->n_floats, DT_F32, 0) ? failed(z, "setup") : 0;
    }
    /* A checkpoint or --init filled the pieces themselves (else the
     * initialisation did, piece by piece, or they are in the window). */
    if (!z->inited && !r->pieces_filled) {
        for (int s = 0; s < z->nseg; s++) dt_zero_keep_piece(z, s);
        dt_window_drop(z->m->params, 0, z->m->n_floats * sizeof(float));
    }
    if (z->mixed && dt_zero_params_refresh(z)) return failed(z, "setup");
    return 0;
}

static int zero_begin_step(void *self, long step)
{
    zero *z = self;
    dt_zero_drop_all(z); /* what an evaluation or a save gathered */
    z->step = step;
    z->bytes_at_begin = dt_comm_bytes_sent(z->comm);
    z->wait_ms = 0; /* from here: the gathers' and reduce-scatters' waits of this step */
    return z->error ? failed(z, "step") : 0;
}

static void zero_before_backward(void *self, int micro, int last)
{
    zero *z = self;
    z->micro = micro;
    z->last = last;
    dt_zero_grads_hook(z);
}

static int zero_end_grads(void *self)
{
    zero *z = self;
    dt_zero_note(z, "grads_end", -1);
    int rc = dt_zero_grads_finish(z); /* its waits count in wait_ms */
    return rc ? failed(z, "gradient reduce-scatter") : 0;
}

/* Block sums of this rank's pieces, gathered, added in layout order: the
 * same blocks in the same order as dt_grad_norm of the whole buffer. */
static int zero_grad_norm(void *self, double *norm)
{
    zero *z = self;
    int n = z->map.n;
    size_t per = z->map.len / DT_NORM_BLOCK;
    double *mine = malloc(per * sizeof *mine), *all = malloc((size_t)n * per * sizeof *all);
    if (!mine || !all) return free(mine), free(all), out_of_memory(z, "the norm's blocks");
    for (int s = 0; s < z->nseg; s++) {
        const dt_flat_range *p = &z->map.mine[s];
        dt_norm_blocks(dt_zero_grads_of(z, s), p->hi - p->lo, mine + p->at / DT_NORM_BLOCK);
    }
    int rc = dt_allgather(z->comm, mine, all, per, DT_F64);
    double sum = 0.0;
    for (int s = 0; rc == 0 && s < z->nseg; s++)
        for (int q = 0; q < n; q++)
            for (size_t k = 0; k < z->map.piece[s] / DT_NORM_BLOCK; k++)
                sum += all[(size_t)q * per + z->map.mine[s].at / DT_NORM_BLOCK + k];
    free(mine);
    free(all);
    *norm = sqrt(sum);
    return rc ? failed(z, "gradient norm") : 0;
}

static int zero_update(void *self, double lr, float coef)
{
    zero *z = self;
    dt_optimizer *o = z->S->rank->opt;
    dt_optimizer_begin_step(o);
    for (int s = 0; s < z->nseg; s++) {
        const dt_flat_range *p = &z->map.mine[s];
        dt_optimizer_update(o, z->m, dt_zero_params_of(z, s), dt_zero_grads_of(z, s), p->at,
                            p->lo, p->hi, lr, coef);
    }
    int rc = dt_zero_params_refresh(z); /* its waits count in wait_ms */
    z->bytes_sent = dt_comm_bytes_sent(z->comm) - z->bytes_at_begin;
    return rc ? failed(z, "parameter all-gather") : 0;
}

static void zero_traffic(void *self, double *comm_ms, uint64_t *bytes)
{
    zero *z = self;
    *comm_ms = z->wait_ms;
    *bytes = z->bytes_sent;
}

/* Stage 3: every rank evaluates every batch alone, so that all of them run
 * the same forwards (each gathers the layers with the others). */
static int zero_eval_group(void *self, int final, dt_comm **group)
{
    zero *z = self;
    (void)final;
    if (z->o.stage >= 3) *group = NULL;
    return 1;
}

/* Stage 3: every segment gathered, for a writer of the whole model (its
 * checkpoints are shards: they need none of this). */
static int zero_gather_params(void *self)
{
    zero *z = self;
    return dt_zero_gather_all(z) ? failed(z, "gathering the parameters") : 0;
}

static int zero_release(void *self)
{
    dt_zero_drop_all(self);
    return 0;
}

/* The parameters' hash, segment by segment (stage 3 gathers one at a time). */
static int zero_replicas(void *self, uint64_t *hash)
{
    zero *z = self;
    uint64_t *h = calloc((size_t)z->nseg, sizeof *h);
    if (!h) return out_of_memory(z, "the replica check");
    for (int s = 0; s < z->nseg; s++) {
        int was = z->seg[s].gathered;
        if (z->o.stage >= 3 && dt_zero_gather_one(z, s))
            return free(h), failed(z, "replica check");
        const char *w = dt_zero_working(z);
        size_t esz = dt_zero_esz(z);
        h[s] = dt_fnv1a64(w + dt_zero_seg_lo(z, s) * esz, dt_zero_seg_len(z, s) * esz);
        if (z->o.stage >= 3 && !was) dt_zero_release_one(z, s);
    }
    uint64_t all = dt_fnv1a64(h, (size_t)z->nseg * sizeof *h);
    free(h);
    int64_t lo = (int64_t)all, hi = (int64_t)all;
    int same = dt_fingerprints_agree(z->comm, &lo, &hi, 1);
    if (same < 0) return failed(z, "comparing replicas");
    if (hash) *hash = all;
    return same;
}

static void zero_describe(void *self, FILE *f)
{
    zero *z = self;
    int accum16 = z->shard_g.bf16 || z->m->accum16;
    fprintf(f, " x %d ranks (ZeRO-%d over %s, pieces of %.1f M parameters, gradients "
            "accumulated in %s, reduce-scattered in %s", z->map.n, z->o.stage,
            dt_comm_transport(z->comm), (double)z->map.len / 1e6, accum16 ? "bf16" : "fp32",
            z->o.wire == DT_BF16 ? "bf16" : "fp32");
    if (z->o.stage >= 3)
        fprintf(f, ", prefetch %d, reshard after forward %s", z->o.prefetch,
                z->o.reshard_after_forward ? "yes" : "no");
    fprintf(f, ")");
}

static void zero_destroy(void *self)
{
    zero *z = self;
    if (z->seg) {
        dt_zero_grads_free(z);
        for (int s = 0; s < z->nseg; s++)
            if (z->seg[s].ag) dt_wait(z->seg[s].ag);
    }
    if (z->m) {
        size_t bytes = z->m->n_floats * sizeof(float), esz = dt_zero_esz(z);
        if (z->master_whole) dt_mem_account(DT_MEM_PARAMS, -(long long)bytes);
        if (z->window_p) dt_window_free(z->m->params, bytes), z->m->params = NULL;
        if (z->window_g) dt_window_free(z->m->grads, bytes), z->m->grads = NULL;
        if (z->window16) dt_window_free(z->m->params16, bytes / 2), z->m->params16 = NULL;
        dt_mem_account(DT_MEM_PARAMS, -(long long)(z->live * esz));
        z->m->param_need = NULL;
        z->m->param_done = NULL;
        z->m->grad_ready = NULL;
    }
    if (z->events) fclose(z->events);
    dt_free(z->shard_p);
    dt_free(z->shard16);
    dt_free(dt_gbuf_ptr(z->shard_g));
    free(z->seg);
    dt_shard_map_free(&z->map);
    free(z);
}

static const dt_strategy_ops zero_ops = {
    .name = "zero",
    .plan = zero_plan,
    .start = zero_start,
    .begin_step = zero_begin_step,
    .before_backward = zero_before_backward,
    .end_grads = zero_end_grads,
    .grad_norm = zero_grad_norm,
    .update = zero_update,
    .traffic = zero_traffic,
    .eval_group = zero_eval_group,
    .gather_params = zero_gather_params,
    .release = zero_release,
    .replicas_identical = zero_replicas,
    .describe = zero_describe,
    .destroy = zero_destroy,
};

int dt_zero_strategy(dt_strategy *S, const dt_zero_opts *o)
{
    dt_rank *r = S->rank;
    if (o->stage < 1 || o->stage > 3)
        return dt_strf(r->err, sizeof r->err, "ZeRO stage %d: use 1, 2 or 3", o->stage), -1;
    zero *z = calloc(1, sizeof *z);
    if (!z) return dt_strf(r->err, sizeof r->err, "ZeRO: out of memory"), -1;
    z->S = S;
    z->comm = r->world;
    z->o = *o;
    if (z->o.prefetch < 0) z->o.prefetch = 0;
    const char *events = getenv("DTRAIN_ZERO_EVENTS");
    if (events && events[0]) {
        char path[1024];
        dt_strf(path, sizeof path, "%s.%d", events, r->rank);
        if (!(z->events = fopen(path, "w"))) {
            free(z);
            return dt_strf(r->err, sizeof r->err, "DTRAIN_ZERO_EVENTS: cannot write %s", path), -1;
        }
    }
    S->lockstep = r->world;
    S->dp_index = r->rank;
    S->dp_size = r->size;
    return dt_strategy_add(S, &zero_ops, z);
}
