/* ZeRO as a strategy layer: what a rank holds, the step's hooks, and the
 * gradient norm over pieces. See zero.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/sum.h"
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

/* Every segment padded to a multiple of equal pieces of whole norm blocks. */
static int zero_relayout(void *self, dt_rank *r, dt_gpt *layout)
{
    zero *z = self;
    (void)r;
    return dt_gpt_pad_segments(layout, dt_shard_align(z->n)) ? out_of_memory(z, "the layout") : 0;
}

/* A buffer of the model as a window, unless a layer above made it one
 * already (a pipeline stage's): then it stays that layer's. Its parts come
 * and go every step, so their pages are pooled (core/window.h). */
static int window(void **buf, size_t bytes, int *mine)
{
    if (*buf) return 0;
    *mine = 1;
    return (*buf = dt_window_reserve_pooled(bytes)) ? 0 : -1;
}

/* This rank's pieces (of the segments the layers above left it), and of
 * what they own for the norm and the checkpoint: S->shard, S->owned and
 * S->saves. Where the layer above wrote from one rank of this group (a
 * stage's first data-parallel rank), every rank of it now writes its own
 * pieces: the writers are every rank of the job. */
static int own_pieces(zero *z, dt_share *share)
{
    dt_strategy *S = z->S;
    z->list = malloc((size_t)z->nseg * sizeof *z->list);
    if (!z->list) return out_of_memory(z, "the shard's ranges");
    z->ranges = dt_shard_map_ranges(&z->map, z->list);
    for (int s = 0; s < z->nseg; s++) z->held_floats += dt_zero_has(z, s) ? dt_zero_seg_len(z, s) : 0;
    share->opt_lo = share->opt_hi = 0;
    share->opt_ranges = z->ranges;
    S->shard = &z->ranges;
    if (!S->owned) return 0; /* no layer above: the pieces are what this rank owns */
    z->owned_list = malloc((size_t)(z->ranges.n + S->owned->n) * sizeof *z->owned_list);
    if (!z->owned_list) return out_of_memory(z, "the owned ranges");
    z->owned = dt_flat_ranges_within(&z->ranges, S->owned, z->owned_list);
    S->owned = &z->owned;
    S->saves = &z->owned;
    S->save_group = NULL;
    return 0;
}

/* hpZ: this rank's secondary pieces, 1/K of each segment it holds. */
static int secondary_partition(zero *z)
{
    for (int s = 0; s < z->nseg; s++) {
        z->seg[s].sec_at = z->sec_len;
        if (dt_zero_has(z, s)) z->sec_len += dt_zero_seg_len(z, s) / (size_t)z->hpz_k;
    }
    z->sec = dt_alloc(z->sec_len * dt_zero_esz(z), DT_MEM_PARAMS);
    return z->sec || z->sec_len == 0 ? 0 : -1;
}

/* The buffers this stage does not hold whole become windows; the
 * optimizer's state covers this rank's pieces. */
static int zero_plan(void *self, dt_rank *r, dt_gpt *layout, dt_share *share)
{
    zero *z = self;
    (void)r;
    z->m = layout;
    z->L = layout->cfg.n_layer;
    z->mixed = layout->mixed.on;
    if (dt_shard_map_build(&z->map, layout, z->n, z->me, z->S->held))
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
        int accum16 = layout->accum.bf16;
        layout->accum.bf16 = 0;
        void *g = dt_alloc_shared(z->map.len * (accum16 ? sizeof(uint16_t) : sizeof(float)), DT_MEM_GRADS);
        z->shard_g = accum16 ? (dt_gbuf){NULL, g} : dt_gbuf_f32(g);
        /* Each segment's gradients of a micro-batch go to a slot
         * (hold_grads); the model's grads buffer is never made. */
        if (!g || dt_gpt_set_grad_slots(layout))
            return out_of_memory(z, "the gradient shard");
        z->S->grads_kept_zero = 1;
        z->S->shard_grads = z->shard_g;
    }
    /* fp32 pieces: stage 3's parameters, or mixed precision's master
     * weights (optimizer state, K = 12 counts them) at every stage. */
    if (z->o.offload_params) { /* the pieces live in the optimizer's store */
        if (z->o.stage < 3 || z->mixed)
            return dt_strf(z->S->rank->err, sizeof z->S->rank->err, "offload_param holds "
                           "stage 3's fp32 pieces; this run has stage %d%s", z->o.stage,
                           z->mixed ? " and bf16" : ""), -1;
        if (window((void **)&layout->params, bytes, &z->window_p))
            return out_of_memory(z, "the parameter window");
        z->S->params_in_store = 1;
    } else if (z->o.stage >= 3 || z->mixed) {
        z->shard_p = dt_alloc_shared(z->map.len * sizeof(float), z->mixed ? DT_MEM_OPTIM : DT_MEM_PARAMS);
        if (!z->shard_p || window((void **)&layout->params, bytes, &z->window_p))
            return out_of_memory(z, "the parameter shard");
        z->S->shard_params = z->shard_p;
    }
    if (z->o.stage >= 3 && z->mixed) { /* the bf16 pieces, gathered into a bf16 window */
        z->shard16 = dt_alloc_shared(z->map.len * sizeof(uint16_t), DT_MEM_PARAMS);
        if (!z->shard16 || window((void **)&layout->mixed.params16, layout->n_floats * 2, &z->window16))
            return out_of_memory(z, "the bf16 parameter shard");
    }
    if (z->o.stage >= 3) { /* a step's gathers go to slots (zero_params.c) */
        dt_slot_pool_init(&z->param_pool, DT_SLOTS_SHARED_HELD, DT_MEM_PARAMS);
        if (dt_gpt_set_param_slots(layout)) return out_of_memory(z, "the segment table");
    }
    for (int s = 0; s < z->nseg && z->o.stage >= 3; s++)
        z->seg[s].persistent = dt_zero_seg_len(z, s) <= z->o.persist_floats;
    if (z->hpz_comm && secondary_partition(z)) return out_of_memory(z, "hpZ's secondary pieces");
    z->prev_need = layout->hooks.param_need;
    z->prev_done = layout->hooks.param_done;
    z->prev_ctx = layout->hooks.param_ctx;
    layout->hooks.param_need = dt_zero_param_need;
    layout->hooks.param_done = dt_zero_param_done;
    layout->hooks.param_ctx = z;
    return own_pieces(z, share);
}

/* The ranks start from the same weights: stages 1-2 in fp32 take rank 0's;
 * a rank that keeps fp32 pieces (stage 3, mixed precision) keeps its
 * pieces of what the initialisation (piece by piece) or a weights file
 * (whole, in the window) gave, and with mixed precision rounds them into
 * the working copy. */
static int zero_start(void *self, dt_rank *r)
{
    zero *z = self;
    if (z->error) return failed(z, "setup"); /* the initialisation's */
    if (!dt_zero_keeps_pieces(z)) {
        float *p = z->m->params;
        for (int s = 0; s < z->nseg; s++) {
            size_t lo = dt_zero_seg_lo(z, s);
            if (dt_zero_has(z, s) &&
                dt_broadcast(z->comm, p + lo, p + lo, dt_zero_seg_len(z, s), DT_F32, 0))
                return failed(z, "setup");
        }
        return 0;
    }
    /* A checkpoint or --init filled the pieces themselves (else the
     * initialisation did, piece by piece, or they are in the window). */
    if (!z->inited && !r->pieces_filled) {
        for (int s = 0; s < z->nseg; s++)
            if (dt_zero_keep_piece(z, s)) return failed(z, "setup");
        dt_window_drop(z->m->params, 0, z->m->n_floats * sizeof(float));
    }
    if (z->mixed && dt_zero_params_refresh(z)) return failed(z, "setup");
    return 0;
}

/* The bytes a traffic group's communicators have sent, all and off the
 * host: the data-parallel group, hpZ's, qgZ's two (absent ones count 0). */
static zero_bytes group_sent(const zero *z, int group)
{
    dt_comm *const c[ZERO_GROUPS][2] = {{z->comm, NULL}, {z->hpz_comm, NULL},
                                        {z->qgz_local, z->qgz_cross}};
    zero_bytes b = {0, 0};
    for (int i = 0; i < 2; i++) {
        b.all += dt_comm_bytes_sent(c[group][i]);
        b.off += dt_comm_bytes_sent_off_host(c[group][i]);
    }
    return b;
}

static int zero_begin_step(void *self, long step)
{
    zero *z = self;
    dt_zero_drop_all(z); /* what an evaluation or a save gathered */
    z->step = step;
    for (int g = 0; g < ZERO_GROUPS; g++) z->at_begin[g] = group_sent(z, g);
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

/* The updated pieces (dt_step_local_update ran over them) to every rank. */
static int zero_after_update(void *self)
{
    zero *z = self;
    int rc = dt_zero_params_refresh(z); /* its waits count in wait_ms */
    zero_bytes d[ZERO_GROUPS];
    z->bytes_sent = 0;
    for (int g = 0; g < ZERO_GROUPS; g++) {
        zero_bytes now = group_sent(z, g);
        d[g] = (zero_bytes){now.all - z->at_begin[g].all, now.off - z->at_begin[g].off};
        z->bytes_sent += d[g].all;
    }
    if (z->events) /* what went where, from the links' counters */
        fprintf(z->events, "%ld traffic %llu %llu hpz %llu %llu qgz %llu %llu\n", z->step,
                (unsigned long long)d[0].all, (unsigned long long)d[0].off,
                (unsigned long long)d[1].all, (unsigned long long)d[1].off,
                (unsigned long long)d[2].all, (unsigned long long)d[2].off);
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
        if (!dt_zero_has(z, s)) continue;
        int was = z->seg[s].gathered;
        if (z->o.stage >= 3 && dt_zero_gather_one(z, s))
            return free(h), failed(z, "replica check");
        h[s] = dt_sum64(dt_zero_seg_working(z, s), dt_zero_seg_len(z, s) * dt_zero_esz(z));
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
    int accum16 = z->shard_g.bf16 || z->m->accum.bf16;
    dt_strategy_describe_blocks(z->S, f, z->map.n);
    fprintf(f, "ZeRO-%d over %s, pieces of %.1f M parameters, gradients "
            "accumulated in %s, reduce-scattered in ", z->o.stage,
            dt_comm_transport(z->comm), (double)z->map.len / 1e6, accum16 ? "bf16" : "fp32");
    if (!z->o.quant_grads)
        fprintf(f, "%s", z->o.wire == DT_BF16 ? "bf16" : "fp32");
    else if (z->qgz_local) /* qgZ */
        fprintf(f, "int%d blocks of %d by all-to-alls over %d ranks (%s), then %d hosts (%s)",
                z->o.grad_bits, z->o.quant_block, z->qgz_k, dt_comm_transport(z->qgz_local),
                z->qgz_h, dt_comm_transport(z->qgz_cross));
    else
        fprintf(f, "int%d blocks of %d by one all-to-all", z->o.grad_bits, z->o.quant_block);
    if (z->o.stage >= 3)
        fprintf(f, ", prefetch %d, reshard after forward %s", z->o.prefetch,
                z->o.reshard_after_forward ? "yes" : "no");
    if (z->hpz_comm)
        fprintf(f, ", hpZ: backward gathers over %d ranks (%s)", z->hpz_k,
                dt_comm_transport(z->hpz_comm));
    fprintf(f, ")");
}

static void zero_destroy(void *self)
{
    zero *z = self;
    if (z->seg) {
        dt_zero_grads_free(z);
        dt_zero_free_pieces(z);
        for (int s = 0; s < z->nseg; s++)
            if (z->seg[s].ag) dt_wait(z->seg[s].ag);
        for (int s = 0; s < z->nseg; s++) free(z->seg[s].qbuf);
    }
    if (z->m) {
        size_t bytes = z->m->n_floats * sizeof(float), esz = dt_zero_esz(z);
        if (z->master_whole) dt_mem_account(DT_MEM_PARAMS, -(long long)(z->held_floats * 4));
        if (z->window_p) dt_window_free(z->m->params, bytes), z->m->params = NULL;
        for (int s = 0; z->seg && s < z->nseg; s++)
            if (z->seg[s].grads_held) dt_gpt_grads_release(z->m, s);
        if (z->window16) dt_window_free(z->m->mixed.params16, bytes / 2), z->m->mixed.params16 = NULL;
        for (int s = 0; z->m->param_slots && s < z->nseg; s++) z->m->param_slots[s] = NULL;
        dt_slot_pool_free(&z->param_pool);
        dt_mem_account(DT_MEM_PARAMS, -(long long)(z->live * esz));
        if (z->m->hooks.param_ctx == z) z->m->hooks.param_need = NULL, z->m->hooks.param_done = NULL;
        z->m->hooks.grad_ready = NULL;
    }
    if (z->events) fclose(z->events);
    if (z->hpz_comm) dt_comm_destroy(z->hpz_comm);
    dt_zero_qgz_free(z);
    dt_free(z->sec);
    if (z->owns_comm) dt_comm_destroy(z->comm);
    free(z->list);
    free(z->owned_list);
    dt_free(z->shard_p);
    dt_free(z->shard16);
    dt_free(dt_gbuf_ptr(z->shard_g));
    free(z->seg);
    dt_shard_map_free(&z->map);
    free(z);
}

/* The whole model sharded over the group by the stage's formulas (a layer
 * above that splits the model answers first). */
static int zero_mem_plan(void *self, int r, dt_rank_mem *out)
{
    (void)r;
    *out = (dt_rank_mem){.floats = 0, .copies = ((zero *)self)->n};
    return 1;
}

/* Stage 3 also chooses who evaluates (every rank, alone): the others leave
 * that to the layers above. */
#define ZERO_OPS                                  \
    .name = "zero", .relayout = zero_relayout,    \
    .plan = zero_plan, .start = zero_start,       \
    .begin_step = zero_begin_step,                \
    .before_backward = zero_before_backward,      \
    .end_grads = zero_end_grads,                  \
    .after_update = zero_after_update,            \
    .traffic = zero_traffic,                      \
    .gather_params = zero_gather_params,          \
    .release = zero_release,                      \
    .replicas_identical = zero_replicas,          \
    .describe = zero_describe,                    \
    .mem_plan = zero_mem_plan,                    \
    .destroy = zero_destroy
static const dt_strategy_ops zero_ops = {ZERO_OPS};
static const dt_strategy_ops zero3_ops = {ZERO_OPS, .eval_group = zero_eval_group};

/* hpZ's groups: K consecutive ranks of the data-parallel group, which the
 * launcher places on one host. */
static int hpz_group(zero *z, dt_rank *r)
{
    int k = z->o.hpz;
    if (z->o.stage < 3 || z->n % k)
        return dt_strf(r->err, sizeof r->err, "zero_hpz_partition_size %d: hpZ splits stage "
                       "3's %d data-parallel ranks into groups of that many; use a divisor of "
                       "%d (the ranks of a host)%s", k, z->n, z->n,
                       z->o.stage < 3 ? ", with --zero-stage 3" : ""), -1;
    if (dt_comm_split(z->comm, z->me / k, z->me, &z->hpz_comm))
        return dt_strf(r->err, sizeof r->err, "hpZ: forming groups of %d: %s", k,
                       dt_comm_error(z->comm)), -1;
    z->hpz_k = k;
    z->hpz_me = z->me % k;
    return 0;
}

int dt_zero_strategy_on(dt_strategy *S, dt_comm *group, int owns, const dt_zero_opts *o)
{
    dt_rank *r = S->rank;
    zero *z = NULL;
    if (o->stage < 1 || o->stage > 3) {
        dt_strf(r->err, sizeof r->err, "ZeRO stage %d: use 1, 2 or 3", o->stage);
        goto fail;
    }
    if (!(z = calloc(1, sizeof *z))) {
        dt_strf(r->err, sizeof r->err, "ZeRO: out of memory");
        goto fail;
    }
    z->S = S;
    z->comm = group;
    z->owns_comm = owns;
    z->n = dt_comm_size(group);
    z->me = dt_comm_rank(group);
    z->o = *o;
    if (z->o.prefetch < 0) z->o.prefetch = 0;
    const char *events = getenv("DTRAIN_ZERO_EVENTS");
    if (events && events[0]) {
        char path[1024];
        dt_strf(path, sizeof path, "%s.%d", events, r->rank);
        if (!(z->events = fopen(path, "w"))) {
            dt_strf(r->err, sizeof r->err, "DTRAIN_ZERO_EVENTS: cannot write %s", path);
            goto fail;
        }
    }
    if (o->hpz > 1 && hpz_group(z, r)) goto fail;
    if (o->quant_grads && o->stage < 3) {
        dt_strf(r->err, sizeof r->err, "qgZ quantizes stage 3's gradient reduce-scatter: use "
                "--zero-stage 3");
        goto fail;
    }
    if (o->quant_grads && dt_zero_qgz_setup(z, r->err, sizeof r->err)) goto fail;
    if (dt_strategy_add_norm_group(S, group)) {
        dt_strf(r->err, sizeof r->err, "ZeRO: too many layers split the gradients");
        goto fail;
    }
    S->lockstep = r->world;
    S->defer_update = o->stage >= 3 && o->defer_update && !o->offload_params;
    S->reduce_each_micro = o->stage >= 2;
    dt_strategy_dp_blocks(S, group);
    return dt_strategy_add(S, o->stage >= 3 ? &zero3_ops : &zero_ops, z);
fail:
    if (z && z->hpz_comm) dt_comm_destroy(z->hpz_comm);
    if (z) dt_zero_qgz_free(z);
    if (owns) dt_comm_destroy(group);
    free(z);
    return -1;
}

int dt_zero_strategy(dt_strategy *S, const dt_zero_opts *o)
{
    return dt_zero_strategy_on(S, S->rank->world, 0, o);
}
