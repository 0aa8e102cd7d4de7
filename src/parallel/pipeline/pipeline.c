/* Pipeline parallelism: the strategy layer. See pipeline.h. */
#include "parallel/pipeline/pipeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/sum.h"
#include "core/str.h"
#include "core/window.h"
#include "kernels/optimizer.h"
#include "model/optimizer.h"
#include "parallel/fingerprint.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/partition_cost.h"
#include "parallel/pipeline/stage.h"

typedef struct {
    dt_strategy *S;
    dt_comm *pp, *tied;      /* the mesh's pipeline group and first-and-last-stage pair */
    dt_mesh g;               /* the sizes and this rank's place (the groups stay the mesh's) */
    int p, me, V, nstages, M;
    dt_pp_kind kind;
    dt_pp_part_kind part;
    dt_pp_costs costs;       /* --pp-partition cost: as measured by rank 0 */
    int measured;            /* costs holds them */
    dt_pp_schedule sched;
    int *cut;                /* [nstages + 1] */
    dt_flat_range range[DT_PP_MAX_RANGES];
    dt_flat_ranges held;
    dt_flat_range own_range[DT_PP_MAX_RANGES], *own_within;
    dt_flat_ranges owned;    /* held, less the tied copy on the last stage, within what the
                              * layers above own: the norm's and a checkpoint's */
    int rep;                 /* this rank's replica index: 0 gathers the final weights */
    dt_gpt_part *parts;      /* the activation slots' parts */
    dt_pp_exec x;
    dt_gpt *m;
    int win_p, win_p16, win_g, win_g16; /* model buffers that are this layer's windows */
    long long acct_p;        /* bytes accounted for the fp32 parameters' window */
    uint64_t tied_bytes;
    long long gathered; /* parameter bytes the writer holds beyond its own, after gathering */
} pipeline;

static int fail(pipeline *P, const char *what, dt_comm *c)
{
    dt_rank *r = P->S->rank;
    return dt_strf(r->err, sizeof r->err, "pipeline: %s: %s", what, dt_comm_error(c)), -1;
}

/* ---- checking a configuration ------------------------------------------- */

static int build_schedule(const dt_parallel_opts *o, int accum, dt_pp_schedule *s, char *err,
                          size_t n)
{
    dt_pp_kind kind;
    char why[256];
    if (dt_pp_kind_parse(o->pp_schedule, &kind))
        return dt_strf(err, n, "--pp-schedule %s: not a schedule (naive, gpipe, 1f1b, "
                       "interleaved, zb1p)", o->pp_schedule), -1;
    if (kind != DT_PP_INTERLEAVED && o->pp_virtual > 1)
        return dt_strf(err, n, "--pp-virtual %d applies to --pp-schedule interleaved (this run "
                       "has %s)", o->pp_virtual, o->pp_schedule), -1;
    if (dt_pp_schedule_build(s, kind, o->pp, kind == DT_PP_INTERLEAVED ? o->pp_virtual : 1,
                             accum, why, sizeof why))
        return dt_strf(err, n, "%s", why), -1;
    if (dt_pp_schedule_check(s, why, sizeof why)) {
        dt_pp_schedule_free(s);
        return dt_strf(err, n, "--pp-schedule %s failed its static check (a bug): %s",
                       o->pp_schedule, why), -1;
    }
    return 0;
}

/* dt_pp_check, keeping the schedule it built in *keep (NULL: freed). */
static int check(const dt_parallel_opts *o, int world, int accum, int *dp, dt_pp_schedule *keep,
                 char *err, size_t errlen)
{
    dt_pp_part_kind part;
    if (world % o->pp != 0)
        return dt_strf(err, errlen, "--pp %d does not divide the job's %d ranks (ranks = pp x "
                       "data-parallel size): start %d ranks, or another --pp", o->pp, world,
                       (world / o->pp + 1) * o->pp), -1;
    if (o->zero.stage > 1)
        return dt_strf(err, errlen, "--zero-stage %d with --pp: a stage's gradients live across "
                       "its micro-batches, so only the optimizer state is split within a "
                       "stage (as DeepSpeed and Megatron do): use --zero-stage 1, or 0 (DDP "
                       "within each stage)", o->zero.stage), -1;
    if (dt_pp_part_parse(o->pp_partition, &part))
        return dt_strf(err, errlen, "--pp-partition %s: use uniform, params or cost",
                       o->pp_partition), -1;
    dt_pp_schedule s;
    if (build_schedule(o, accum, &s, err, errlen)) return -1;
    if (s.kind == DT_PP_INTERLEAVED && part != DT_PP_PART_UNIFORM) {
        dt_pp_schedule_free(&s);
        return dt_strf(err, errlen, "--pp-partition %s with --pp-schedule interleaved: its "
                       "stages are equal, a chunk of every rank per round; use uniform, or "
                       "1f1b or zb1p to balance the stages", o->pp_partition), -1;
    }
    if (keep) *keep = s;
    else dt_pp_schedule_free(&s);
    *dp = world / o->pp;
    return 0;
}

int dt_pp_check(const dt_parallel_opts *o, int world, int accum, int *dp, char *err,
                size_t errlen)
{
    return check(o, world, accum, dp, NULL, err, errlen);
}

int dt_pp_check_schedule(const dt_parallel_opts *o, int world, int accum, int *dp,
                         dt_pp_schedule *sched, char *err, size_t errlen)
{
    return check(o, world, accum, dp, sched, err, errlen);
}

/* ---- what this rank holds ------------------------------------------------- */

static int held_segment(const pipeline *P, const dt_gpt *m, int s)
{
    return dt_flat_ranges_cover(&P->held, dt_gpt_segment_start(m, s), dt_gpt_segment_start(m, s + 1));
}

/* What this rank alone counts in the norm and writes of a checkpoint:
 * its stage's ranges, the tied embedding on stage 0 only (the last
 * stage's copy is the same bits), within what a layer above owns (a
 * tensor-parallel rank's slices). Loading fills every rank's held ranges,
 * from any layout. */
static int plan_owned(pipeline *P)
{
    int n = 0;
    for (int i = 0; i < P->held.n; i++)
        if (P->me == 0 || P->range[i].lo != 0) P->own_range[n++] = P->range[i];
    P->owned = (dt_flat_ranges){n, P->own_range, P->held.len};
    return dt_strategy_own(P->S, &P->owned, &P->own_within);
}

/* ---- plan and start ------------------------------------------------------- */

/* --pp-partition cost: rank 0 of the job measures (partition_cost.h) and
 * every rank receives its numbers, so every pipeline (one per
 * data-parallel index) cuts alike. Collective over the job. */
static int measured_costs(pipeline *P, dt_rank *r, const dt_gpt *m)
{
    double c[4] = {0, 0, 0, 0}; /* measured (1 or 0), embed, layer, head */
    char why[sizeof r->err] = "";
    dt_pp_costs k;
    if (r->rank == 0 && dt_pp_measure_costs(m, r->B, r->T, &k, why, sizeof why) == 0)
        c[0] = 1, c[1] = k.embed_ms, c[2] = k.layer_ms, c[3] = k.head_ms;
    if (dt_broadcast(r->world, c, c, 4, DT_F64, 0))
        return fail(P, "sharing the measured costs of --pp-partition cost", r->world);
    if (c[0] != 1)
        return dt_strf(r->err, sizeof r->err, "--pp-partition cost: measuring the layers "
                       "failed on rank 0%s%s", why[0] ? ": " : " (its message says why)", why),
               -1;
    P->costs = (dt_pp_costs){.embed_ms = c[1], .layer_ms = c[2], .head_ms = c[3]};
    P->measured = 1;
    return 0;
}

/* The cut points, P->cut (partition.h). Collective for --pp-partition
 * cost, whose costs are measured first (not when the stages outnumber
 * the layers: that is refused). */
static int partition(pipeline *P, dt_rank *r, const dt_gpt *m)
{
    if (!(P->cut = malloc((size_t)(P->nstages + 1) * sizeof *P->cut)))
        return dt_strf(r->err, sizeof r->err, "pipeline: out of memory"), -1;
    if (P->part == DT_PP_PART_COST && P->nstages <= m->cfg.n_layer && measured_costs(P, r, m))
        return -1;
    /* Cut by the whole model's counts: a tensor-parallel rank's slices are
     * not all alike (the last vocabulary slice is shorter), and every rank
     * of a stage must cut the same layers. */
    dt_gpt whole;
    if (dt_gpt_peer_layout(m, 0, 1, &whole, r->err, sizeof r->err)) return -1;
    int rc = dt_pp_cut(&whole, P->nstages, P->part, P->kind == DT_PP_INTERLEAVED,
                       P->measured ? &P->costs : NULL, P->cut, r->err, sizeof r->err);
    dt_gpt_destroy(&whole);
    return rc;
}

static int make_window(void **buf, size_t bytes, size_t held, dt_mem_kind kind)
{
    if (*buf) return 0;
    if (!(*buf = dt_window_reserve(bytes))) return -1;
    dt_mem_account(kind, (long long)held);
    return 1;
}

/* The model's buffers as windows whose held ranges alone become memory.
 * The fp32 parameters' is accounted at start, when it is known whether a
 * layer below keeps them in pieces of its own instead (ZeRO's masters). */
static int windows(pipeline *P, dt_gpt *m, char *err, size_t n)
{
    size_t nf = m->n_floats, h = P->held.len;
    int a = make_window((void **)&m->params, nf * 4, 0, DT_MEM_PARAMS);
    int b = m->mixed.on ? make_window((void **)&m->mixed.params16, nf * 2, h * 2, DT_MEM_PARAMS) : 0;
    int c = m->accum.bf16 ? make_window((void **)&m->accum.grads16, nf * 2, h * 2, DT_MEM_GRADS)
                       : make_window((void **)&m->grads, nf * 4, h * 4, DT_MEM_GRADS);
    if (a < 0 || b < 0 || c < 0)
        return dt_strf(err, n, "pipeline: no address space for the model's windows"), -1;
    P->win_p = a, P->win_p16 = b;
    P->win_g = m->accum.bf16 ? 0 : c, P->win_g16 = m->accum.bf16 ? c : 0;
    return 0;
}

/* Pages of segments this rank does not hold, given back (they were
 * written by the initialisation, or a weights file). */
static void drop_segment(pipeline *P, int s)
{
    dt_gpt *m = P->m;
    size_t lo = dt_gpt_segment_start(m, s), hi = dt_gpt_segment_start(m, s + 1);
    dt_window_drop(m->params, lo * 4, hi * 4);
    if (m->mixed.on) dt_window_drop(m->mixed.params16, lo * 2, hi * 2);
}

static void on_param_done(void *ctx, int segment, int use)
{
    pipeline *P = ctx;
    if (use == DT_USE_INIT && !held_segment(P, P->m, segment)) drop_segment(P, segment);
}

static int pp_plan(void *self, dt_rank *r, dt_gpt *layout, dt_share *share)
{
    pipeline *P = self;
    P->m = layout;
    if (!dt_gpt_tied(&layout->cfg)) P->tied = NULL; /* an untied head: no copy to keep */
    if (partition(P, r, layout)) return -1;
    P->held = dt_pp_held_ranges(layout, P->cut, P->p, P->V, P->me, P->range);
    P->S->held = &P->held;
    if (plan_owned(P)) return dt_strf(r->err, sizeof r->err, "pipeline: out of memory"), -1;
    if (windows(P, layout, r->err, sizeof r->err)) return -1;
    layout->hooks.param_done = on_param_done;
    layout->hooks.param_ctx = P;
    layout->acts.split_backward = P->kind == DT_PP_ZB1P; /* its I and W halves */
    int cap = P->V * P->M + 1;
    if (!(P->parts = malloc((size_t)cap * sizeof *P->parts)))
        return dt_strf(r->err, sizeof r->err, "pipeline: out of memory"), -1;
    share->nslots = dt_pp_exec_slots(&P->sched, P->me, P->cut, P->parts, cap);
    share->slots = P->parts;
    share->model = 1;
    share->opt_ranges = P->held;
    return share->nslots > 0 ? 0 : (dt_strf(r->err, sizeof r->err, "pipeline: no slots"), -1);
}

static int pp_start(void *self, dt_rank *r)
{
    pipeline *P = self;
    for (int s = 0; s < dt_gpt_segments(P->m); s++)
        if (!held_segment(P, P->m, s)) drop_segment(P, s);
    if (P->win_p && !P->S->shard_params && !P->S->params_in_store) {
        P->acct_p = (long long)(P->held.len * 4);
        dt_mem_account(P->m->mixed.on ? DT_MEM_OPTIM : DT_MEM_PARAMS, P->acct_p);
    }
    if (dt_pp_exec_init(&P->x, P->pp, &P->sched, P->cut, P->m, r->B, r->T))
        return dt_strf(r->err, sizeof r->err, "%s", P->x.err), -1;
    return 0;
}

/* ---- each step ------------------------------------------------------------ */

static int pp_grads(void *self, uint64_t first, double *loss)
{
    pipeline *P = self;
    dt_rank *r = P->S->rank;
    for (int i = 0; i < P->held.n; i++)
        dt_gpt_zero_grads_range(P->m, P->range[i].lo, P->range[i].hi);
    double sum = 0;
    if (dt_pp_exec_step(&P->x, P->S, first, &sum))
        return dt_strf(r->err, sizeof r->err, "%s", P->x.err), -1;
    if (dt_broadcast(P->pp, &sum, &sum, 1, DT_F64, (P->nstages - 1) % P->p))
        return fail(P, "the step's loss", P->pp);
    *loss = sum / P->M;
    return 0;
}

/* The tied embedding: the first stage's gradient (the embeddings') plus
 * the last's (the head's), on both, where this rank updates it (all of
 * it, or ZeRO's piece: the pair has the same data-parallel index). */
static int pp_end_grads(void *self)
{
    pipeline *P = self;
    if (!P->tied) return 0;
    dt_flat_range tied = {0, dt_gpt_segment_start(P->m, 1), 0}, out[DT_PP_MAX_RANGES + 1];
    dt_flat_ranges seg0 = {1, &tied, tied.hi};
    const dt_flat_ranges *mine = dt_strategy_updates(P->S);
    dt_flat_ranges part = dt_flat_ranges_within(mine, &seg0, out);
    uint64_t sent = dt_comm_bytes_sent(P->tied);
    for (int i = 0; i < part.n; i++) {
        dt_gbuf g = dt_strategy_grads_at(P->S, &part.r[i]);
        if (dt_allreduce(P->tied, dt_gbuf_ptr(g), dt_gbuf_ptr(g), part.r[i].hi - part.r[i].lo,
                         g.f32 ? DT_F32 : DT_BF16, DT_SUM))
            return fail(P, "summing the tied embedding's gradient", P->tied);
    }
    P->tied_bytes = dt_comm_bytes_sent(P->tied) - sent;
    return 0;
}

static void pp_traffic(void *self, double *comm_ms, uint64_t *bytes)
{
    pipeline *P = self;
    *comm_ms = P->x.wait_ms;
    *bytes = P->x.bytes + P->tied_bytes;
}

/* ---- around the loop ------------------------------------------------------ */

static int pp_eval_loss(void *self, const int32_t *inputs, const int32_t *targets, int b,
                        double *loss)
{
    pipeline *P = self;
    if (dt_pp_exec_forward(&P->x, inputs, targets, b, loss) == 0) return 0;
    return dt_strf(P->S->rank->err, sizeof P->S->rank->err, "%s", P->x.err), -1;
}

/* The whole parameters (of this rank's layout: a tensor-parallel rank's
 * slices) onto the first stage of replica 0, range by range from each
 * stage. */
static int pp_gather_params(void *self)
{
    pipeline *P = self;
    if (P->rep != 0) return 0;
    dt_flat_range buf[DT_PP_MAX_RANGES];
    for (int q = 1; q < P->p; q++) {
        if (P->me != 0 && P->me != q) continue;
        dt_flat_ranges theirs = dt_pp_held_ranges(P->m, P->cut, P->p, P->V, q, buf);
        for (int i = 0; i < theirs.n; i++) {
            const dt_flat_range *r = &buf[i];
            if (r->lo == 0) continue; /* the tied copy: stage 0 has it */
            float *at = P->m->params + r->lo;
            int rc = P->me == 0 ? dt_recv(P->pp, at, r->hi - r->lo, DT_F32, q)
                                : dt_send(P->pp, at, r->hi - r->lo, DT_F32, 0);
            if (rc) return fail(P, "gathering the parameters", P->pp);
        }
    }
    if (P->me == 0 && !P->gathered) {
        P->gathered = (long long)((P->m->n_floats - P->held.len) * 4);
        dt_mem_account(P->m->mixed.on ? DT_MEM_OPTIM : DT_MEM_PARAMS, P->gathered);
    }
    return 0;
}

/* The two copies of the tied embedding must stay the same bits. */
static int pp_replicas(void *self, uint64_t *hash)
{
    pipeline *P = self;
    (void)hash;
    if (!P->tied) return 1;
    uint64_t h = dt_sum64(P->m->params, dt_gpt_segment_start(P->m, 1) * sizeof(float));
    int64_t lo = (int64_t)h, hi = (int64_t)h;
    int same = dt_fingerprints_agree(P->tied, &lo, &hi, 1);
    return same < 0 ? fail(P, "comparing the tied embedding", P->tied) : same;
}

/* The batch line's pipeline. */
static void pp_describe(void *self, FILE *f)
{
    pipeline *P = self;
    fprintf(f, " x pipeline of %d stages (%s, %d micro-batches, layers", P->nstages,
            dt_pp_kind_name(P->kind), P->M);
    for (int k = 0; k < P->nstages; k++)
        fprintf(f, "%s%d-%d", k ? " | " : " ", P->cut[k], P->cut[k + 1] - 1);
    fprintf(f, ")");
}

/* With --pp-partition cost, the measured costs and the stages they gave. */
static void pp_describe_lines(void *self, FILE *f)
{
    pipeline *P = self;
    if (P->part != DT_PP_PART_COST || !P->measured) return;
    fprintf(f, "\npipeline partition cost: embed %.4g ms, layer %.4g ms, head %.4g ms "
            "(forward + backward of a micro-batch, measured on rank 0) -> stages",
            P->costs.embed_ms, P->costs.layer_ms, P->costs.head_ms);
    for (int k = 0; k < P->nstages; k++) fprintf(f, " [%d,%d)", P->cut[k], P->cut[k + 1]);
}

/* "stage 1, 2 in flight": a rank's stages, and the most micro-batches
 * its list holds at once (each in an activation slot). */
static void pp_rank_label(void *self, int rank, char *buf, size_t n)
{
    pipeline *P = self;
    int at[4];
    dt_mesh_coords(&P->g, rank, at);
    int q = at[3], cap = P->V * P->M + 1;
    dt_strf(buf, n, "stage%s %d", P->V > 1 ? "s" : "", q);
    for (int c = 1; c < P->V; c++)
        dt_strf(buf + strlen(buf), n - strlen(buf), ",%d", c * P->p + q);
    dt_gpt_part *parts = malloc((size_t)cap * sizeof *parts);
    int slots = parts ? dt_pp_exec_slots(&P->sched, q, P->cut, parts, cap) : -1;
    free(parts);
    if (slots > 0) dt_strf(buf + strlen(buf), n - strlen(buf), ", %d in flight", slots);
}

/* Rank r's stage by the arithmetic the plan prints (stage.h): what it
 * holds is what pp_plan laid out, for the memory table; of its own
 * layout (a tensor-parallel rank's slices), with ZeRO-1's state split
 * over the ranks that hold the same stage. */
static int pp_mem_plan(void *self, int rank, dt_rank_mem *out)
{
    pipeline *P = self;
    dt_rank *r = P->S->rank;
    dt_pp_stage_mem m;
    dt_gpt peer;
    int at[4], rc;
    dt_mesh_coords(&P->g, rank, at);
    if (at[0] == P->g.tp_i) {
        rc = dt_pp_stage_memory(P->m, &P->sched, P->cut, at[3], r->B, r->T, &m);
    } else {
        if (dt_gpt_peer_layout(P->m, at[0], P->g.tp, &peer, r->err, sizeof r->err)) return -1;
        rc = dt_pp_stage_memory(&peer, &P->sched, P->cut, at[3], r->B, r->T, &m);
        dt_gpt_destroy(&peer);
    }
    if (rc) return dt_strf(r->err, sizeof r->err, "pipeline stage %d: out of memory for its "
                           "plan", at[3]), -1;
    *out = (dt_rank_mem){.floats = m.floats, .in_use = m.in_use, .grads_open = m.grads_open,
                         .acts = m.acts, .copies = P->g.cp * P->g.dp};
    return 1;
}

static void pp_destroy(void *self)
{
    pipeline *P = self;
    dt_pp_exec_free(&P->x);
    dt_pp_schedule_free(&P->sched);
    dt_gpt *m = P->m;
    size_t nf = m ? m->n_floats : 0, h = P->held.len;
    if (P->win_p) {
        dt_mem_account(m->mixed.on ? DT_MEM_OPTIM : DT_MEM_PARAMS, -P->acct_p - P->gathered);
        dt_window_free(m->params, nf * 4), m->params = NULL;
    }
    if (P->win_p16) dt_mem_account(DT_MEM_PARAMS, -(long long)(h * 2)),
                    dt_window_free(m->mixed.params16, nf * 2), m->mixed.params16 = NULL;
    if (P->win_g) dt_mem_account(DT_MEM_GRADS, -(long long)(h * 4)),
                  dt_window_free(m->grads, nf * 4), m->grads = NULL;
    if (P->win_g16) dt_mem_account(DT_MEM_GRADS, -(long long)(h * 2)),
                    dt_window_free(m->accum.grads16, nf * 2), m->accum.grads16 = NULL;
    if (m && m->hooks.param_ctx == P) m->hooks.param_done = NULL;
    free(P->own_within);
    free(P->cut);
    free(P->parts);
    free(P);
}

static const dt_strategy_ops pp_ops = {
    .name = "pipeline",
    .plan = pp_plan,
    .start = pp_start,
    .grads = pp_grads,
    .end_grads = pp_end_grads,
    .traffic = pp_traffic,
    .eval_loss = pp_eval_loss,
    .gather_params = pp_gather_params,
    .replicas_identical = pp_replicas,
    .describe = pp_describe,
    .describe_lines = pp_describe_lines,
    .rank_label = pp_rank_label,
    .mem_plan = pp_mem_plan,
    .destroy = pp_destroy,
};

/* ---- building ------------------------------------------------------------- */

int dt_pp_layer(dt_strategy *S, const dt_mesh *g, const dt_parallel_opts *o)
{
    dt_rank *r = S->rank;
    int per_stage;
    pipeline *P = calloc(1, sizeof *P);
    if (!P) return dt_strf(r->err, sizeof r->err, "pipeline: out of memory"), -1;
    if (check(o, r->size, r->accum, &per_stage, &P->sched, r->err, sizeof r->err))
        return free(P), -1;
    P->S = S;
    P->g = *g;
    P->pp = g->pp_group;
    P->tied = g->tied;
    P->me = g->pp_i;
    P->rep = dt_mesh_replica_index(g);
    P->p = o->pp;
    P->M = r->accum;
    dt_pp_part_parse(o->pp_partition, &P->part);
    P->kind = P->sched.kind;
    P->V = P->sched.V;
    P->nstages = P->p * P->V;
    if (dt_strategy_add_norm_group(S, P->pp))
        return pp_destroy(P), dt_strf(r->err, sizeof r->err, "pipeline: too many layers"), -1;
    return dt_strategy_add(S, &pp_ops, P);
}
