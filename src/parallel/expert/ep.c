/* Expert parallelism as a strategy layer. See ep.h. */
#include "parallel/expert/ep.h"

#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/str.h"
#include "core/timer.h"
#include "core/trace.h"
#include "parallel/fingerprint.h"
#include "parallel/slices.h"

/* A segment whose whole tensors' sums are in flight: passed on to the hook
 * below when they end, segments in the order backward reported them. */
enum { MAX_PIECES = 4 };
typedef struct {
    size_t lo, hi;
    int n;
    dt_request *req[MAX_PIECES];
} pending_seg;

typedef struct {
    dt_strategy *S;
    dt_comm *ep;      /* the mesh's ep_group */
    dt_comm *edp;     /* the ranks of the same experts (the mesh's), or NULL */
    int me, size;
    int replicated;   /* other groups hold the same experts */
    int copies;       /* ranks that hold each set of experts: cp x dp / ep */
    dt_comm *slices;  /* the mesh's: the tp x ep ranks that bring their parts to one writer */
    int tp;           /* tensor-parallel ranks: a rank of slices is tp_i + tp ep_i */
    dt_gpt *m;        /* the rank's layout, from relayout on */
    dt_gpt own_whole; /* the whole model's layout, unless tensor parallelism (above) made it */
    dt_gpt *whole;    /* parameters on the writer, gathered */
    dt_flat_range *map, *own, *own_within;
    dt_flat_ranges in_whole, owned;
    dt_flat_range *dense; /* the floats of the tensors every rank holds whole */
    int ndense;
    void (*next_ready)(void *ctx, size_t lo, size_t hi); /* the hook below ours */
    void *next_ctx;
    pending_seg *queue; /* [segments]: head .. tail in flight */
    int head, tail;
    int expected, reported; /* segments a step's backward reports, and so far */
    int error;        /* a sum over the group failed (said at end_grads) */
    char why[256];
    uint64_t bytes0;
    double ms;        /* in the exchanges and sums, in the last step */
    struct {          /* the rows' exchange in flight, started by the model */
        dt_request *req;
        size_t sc[256], sd[256], rc[256], rd[256];
        const char *what;
        uint64_t t0;
        long long bytes;
    } rows;
} ep_layer;

static int failed(ep_layer *L, const char *what, dt_comm *c)
{
    dt_rank *r = L->S->rank;
    return dt_strf(r->err, sizeof r->err, "expert parallelism: %s: %s", what,
                   c ? dt_comm_error(c) : "out of memory"), -1;
}

/* ---- the model's exchanges ---------------------------------------------- */

static int exchange_counts(void *ctx, const int32_t *send, int32_t *recv, int per_peer,
                           char *err, size_t errlen)
{
    ep_layer *L = ctx;
    uint64_t t0 = dt_now_ns();
    int rc = dt_alltoall(L->ep, send, recv, (size_t)per_peer, DT_I32);
    L->ms += (double)(dt_now_ns() - t0) * 1e-6;
    if (rc == 0) return 0;
    return dt_strf(err, errlen, "all-to-all of the counts over the expert-parallel group: %s",
                   dt_comm_error(L->ep)), -1;
}

static int rows_failed(ep_layer *L, char *err, size_t errlen)
{
    return dt_strf(err, errlen, "all-to-all of the rows over the expert-parallel group: %s",
                   dt_comm_error(L->ep)), -1;
}

/* The exchange's span on the timeline (from its start to its end: started
 * ones overlap the experts' compute), and its exposed part in ms. */
static void rows_done(ep_layer *L, uint64_t wait0)
{
    const uint64_t t1 = dt_now_ns();
    L->ms += (double)(t1 - wait0) * 1e-6;
    if (!dt_trace_on()) return;
    dt_trace_args ta = dt_trace_noargs();
    ta.bytes = L->rows.bytes;
    dt_trace_add(DT_TRACE_COMM, L->rows.what, L->rows.t0, t1, &ta);
}

/* The rows, one variable all-to-all (dt_alltoallv: its algorithm the cost
 * model's choice; a pair with no rows exchanges nothing), or its non-
 * blocking twin when started. */
static int exchange_rows(void *ctx, const float *send, const int32_t *send_rows, float *recv,
                         const int32_t *recv_rows, int width, const char *what, int start,
                         char *err, size_t errlen)
{
    ep_layer *L = ctx;
    size_t *sc = L->rows.sc, *sd = L->rows.sd, *rc = L->rows.rc, *rd = L->rows.rd;
    size_t at_s = 0, at_r = 0;
    if (L->rows.req) return dt_strf(err, errlen, "an exchange of rows is in flight"), -1;
    for (int q = 0; q < L->size; q++) {
        sc[q] = (size_t)send_rows[q] * width, rc[q] = (size_t)recv_rows[q] * width;
        sd[q] = at_s, rd[q] = at_r;
        at_s += sc[q], at_r += rc[q];
    }
    L->rows.what = what;
    L->rows.t0 = dt_now_ns();
    L->rows.bytes = (long long)((at_s - sc[L->me]) * sizeof(float));
    if (start) return dt_ialltoallv(L->ep, send, sc, sd, recv, rc, rd, DT_F32, &L->rows.req)
                          ? rows_failed(L, err, errlen) : 0;
    if (dt_alltoallv(L->ep, send, sc, sd, recv, rc, rd, DT_F32))
        return rows_failed(L, err, errlen);
    rows_done(L, L->rows.t0);
    return 0;
}

static int exchange_wait(void *ctx, char *err, size_t errlen)
{
    ep_layer *L = ctx;
    if (!L->rows.req) return dt_strf(err, errlen, "no exchange of rows in flight"), -1;
    const uint64_t t0 = dt_now_ns();
    const int rc = dt_wait(L->rows.req);
    L->rows.req = NULL;
    if (rc) return rows_failed(L, err, errlen);
    rows_done(L, t0);
    return 0;
}

static int ep_relayout(void *self, dt_rank *r, dt_gpt *layout)
{
    ep_layer *L = self;
    if (dt_gpt_set_ep(layout, L->me, L->size))
        return dt_strf(r->err, sizeof r->err, "%s", layout->error), -1;
    layout->ep.counts = exchange_counts;
    layout->ep.rows = exchange_rows;
    layout->ep.rows_wait = exchange_wait;
    layout->ep.ctx = L;
    return 0;
}

/* ---- the plan: the whole model, ownership, the whole tensors ------------ */

/* What this rank alone counts in the norm and writes: its experts, and on
 * the group's first rank the whole tensors too. */
static int is_expert(const dt_param_tensor *t) { return t->expert; }
static int is_shared(const dt_param_tensor *t) { return !t->expert; }

static int plan_owned(ep_layer *L)
{
    const dt_gpt *m = L->m;
    int n = 0;
    if (!(L->own = malloc((size_t)(m->n_tensors + 1) * sizeof *L->own))) return -1;
    if (L->me == 0) L->own[n++] = (dt_flat_range){0, m->n_floats, 0};
    else n = dt_slices_ranges(m, is_expert, L->own);
    L->owned = (dt_flat_ranges){n, L->own, m->n_floats};
    return dt_strategy_own(L->S, &L->owned, &L->own_within);
}

/* The floats of everything but the experts, padding between tensors
 * included (a sum over the group adds zeros there), merged into runs. */
static int plan_dense(ep_layer *L)
{
    const dt_gpt *m = L->m;
    if (!(L->dense = malloc((size_t)(m->n_tensors + 1) * sizeof *L->dense))) return -1;
    size_t lo = 0;
    for (int i = 0; i <= m->n_tensors; i++) {
        const int expert = i < m->n_tensors && m->tensors[i].expert;
        const size_t at = i < m->n_tensors ? m->tensors[i].offset : m->n_floats;
        if (!expert && i < m->n_tensors) continue;
        if (at > lo) L->dense[L->ndense++] = (dt_flat_range){lo, at, lo};
        if (i < m->n_tensors) lo = m->tensors[i].offset + m->tensors[i].numel;
        lo = (lo + 15) / 16 * 16;
    }
    return 0;
}

static int ep_plan(void *self, dt_rank *r, dt_gpt *layout, dt_share *share)
{
    ep_layer *L = self;
    (void)share;
    L->m = layout;
    /* Tensor parallelism, planned before (above), made the whole layout and
     * the map into it, from this same layout with both cuts. */
    if (L->S->whole) {
        L->whole = L->S->whole;
        return plan_owned(L) || plan_dense(L) ? failed(L, "planning", NULL) : 0;
    }
    L->whole = &L->own_whole;
    if (dt_gpt_create_layout(L->whole, &layout->cfg, layout->prec, r->err, sizeof r->err))
        return -1;
    int n = dt_gpt_tp_ranges(layout, L->whole, NULL, 0);
    if (!(L->map = malloc((size_t)(n ? n : 1) * sizeof *L->map)) || plan_owned(L) ||
        plan_dense(L))
        return failed(L, "planning", NULL);
    dt_gpt_tp_ranges(layout, L->whole, L->map, n);
    L->in_whole = (dt_flat_ranges){n, L->map, layout->n_floats};
    L->S->whole = L->whole;
    L->S->in_whole = &L->in_whole;
    return 0;
}

/* ---- gradients: the whole tensors' summed over the group --------------- */

static void sum_failed(ep_layer *L, int rc)
{
    if (rc == 0 || L->error) return;
    L->error = 1;
    dt_strf(L->why, sizeof L->why, "%s", dt_comm_error(L->ep));
}

/* The oldest segment passed on once its sums ended. */
static void pass_on(ep_layer *L)
{
    pending_seg *p = &L->queue[L->head++];
    for (int i = 0; i < p->n; i++) {
        if (p->req[i]) sum_failed(L, dt_wait(p->req[i]));
        p->req[i] = NULL;
    }
    if (L->next_ready) L->next_ready(L->next_ctx, p->lo, p->hi);
}

/* The segments but the `keep` newest, each after its sums end. Where a
 * segment is passed on must not depend on timing: the layer below may
 * start collectives there (ZeRO's reduce-scatter), which every rank must
 * call in the same order. */
static void drain(ep_layer *L, int keep)
{
    uint64_t t0 = dt_now_ns();
    while (L->tail - L->head > keep) pass_on(L);
    L->ms += (double)(dt_now_ns() - t0) * 1e-6;
}

/* The model's hook in front of the one below (DDP's or ZeRO's): the
 * segment's whole tensors summed over the group, then passed on. Its sums
 * run while backward computes the next segment, and it is passed on when
 * that one is reported (the layer below reads a segment only once told);
 * the step's last segment is passed on at once, the layer below finishing
 * its own work next. */
static void on_grad_ready(void *ctx, size_t lo, size_t hi)
{
    ep_layer *L = ctx;
    pending_seg *p = &L->queue[L->tail++];
    *p = (pending_seg){.lo = lo, .hi = hi};
    for (int i = 0; i < L->ndense && !L->error && p->n < MAX_PIECES; i++) {
        const size_t a = L->dense[i].lo > lo ? L->dense[i].lo : lo;
        const size_t b = L->dense[i].hi < hi ? L->dense[i].hi : hi;
        if (a >= b) continue;
        const dt_gbuf g = dt_gpt_grads_at(L->m, a); /* a slot's, under ZeRO-2/3 */
        void *buf = dt_gbuf_ptr(g);
        sum_failed(L, dt_iallreduce(L->ep, buf, buf, b - a, g.f32 ? DT_F32 : DT_BF16, DT_SUM,
                                    &p->req[p->n++]));
    }
    drain(L, ++L->reported >= L->expected ? 0 : 1);
}

/* Segments a step's backward reports: those the rank holds whole (the
 * rule DDP's buckets follow). */
static int count_reported(const ep_layer *L)
{
    int n = 0;
    for (int s = 0; s < dt_gpt_segments(L->m); s++)
        n += !L->S->held || dt_flat_ranges_cover(L->S->held, dt_gpt_segment_start(L->m, s),
                                                 dt_gpt_segment_start(L->m, s + 1));
    return n;
}

static void ep_before_backward(void *self, int micro, int last)
{
    ep_layer *L = self;
    (void)micro;
    if (!last) return; /* accumulating: the sums wait for the step's last backward */
    if (!L->queue) {
        L->queue = calloc((size_t)dt_gpt_segments(L->m) + 1, sizeof *L->queue);
        L->expected = count_reported(L);
    }
    if (!L->queue) {
        L->error = 1;
        dt_strf(L->why, sizeof L->why, "out of memory");
        return;
    }
    /* The layer below set its hook for this backward (DDP sets the
     * function each time, its context once): ours goes in front. */
    if (L->m->hooks.grad_ready != on_grad_ready) L->next_ready = L->m->hooks.grad_ready;
    if (L->m->hooks.grad_ctx != L) L->next_ctx = L->m->hooks.grad_ctx;
    L->m->hooks.grad_ready = on_grad_ready;
    L->m->hooks.grad_ctx = L;
}

static int ep_end_grads(void *self)
{
    ep_layer *L = self;
    dt_rank *r = L->S->rank;
    if (L->queue) drain(L, 0); /* a segment not reported: the layer below says so */
    L->head = L->tail = L->reported = 0;
    /* Given back as found, whichever layer ended its backward first. */
    if (L->m->hooks.grad_ready == on_grad_ready) L->m->hooks.grad_ready = L->next_ready;
    if (L->m->hooks.grad_ctx == L) L->m->hooks.grad_ctx = L->next_ctx;
    if (!L->error) return 0;
    L->error = 0;
    return dt_strf(r->err, sizeof r->err, "expert parallelism: summing the gradients over the "
                   "group: %s", L->why), -1;
}

static int ep_begin_step(void *self, long step)
{
    ep_layer *L = self;
    (void)step;
    L->bytes0 = dt_comm_bytes_sent(L->ep);
    L->ms = 0;
    return 0;
}

static void ep_traffic(void *self, double *comm_ms, uint64_t *bytes)
{
    ep_layer *L = self;
    *comm_ms += L->ms;
    *bytes += dt_comm_bytes_sent(L->ep) - L->bytes0;
}

/* ---- the whole model on the writer --------------------------------------- */

static int place_slice(ep_layer *L, const dt_gpt *lay, const float *local)
{
    return dt_slices_place(lay, L->whole, local) ? failed(L, "gathering the parameters", NULL)
                                                  : 0;
}

/* Rank k of slices: tensor slice k % tp, experts of ep rank k / tp. */
static int peer_layout(ep_layer *L, int k, dt_gpt *lay)
{
    dt_rank *r = L->S->rank;
    if (dt_gpt_peer_layout(L->m, k % L->tp, L->tp, lay, r->err, sizeof r->err)) return -1;
    if (dt_gpt_set_ep(lay, k / L->tp, L->size) == 0) return 0;
    dt_strf(r->err, sizeof r->err, "%s", lay->error);
    dt_gpt_destroy(lay);
    return -1;
}

static int receive_slice(ep_layer *L, int k)
{
    dt_gpt lay;
    if (peer_layout(L, k, &lay)) return -1;
    float *buf = malloc(lay.n_floats * sizeof(float));
    int rc = !buf ? failed(L, "gathering the parameters", NULL)
             : dt_recv(L->slices, buf, lay.n_floats, DT_F32, k)
                 ? failed(L, "gathering the parameters", L->slices)
                 : place_slice(L, &lay, buf);
    free(buf);
    dt_gpt_destroy(&lay);
    return rc;
}

/* The whole parameters on the writer, from every tensor slice and set of
 * experts (each whole in its own layout by now: the layers below gathered
 * their parts). */
static int ep_gather_params(void *self)
{
    ep_layer *L = self;
    const dt_gpt *m = L->m;
    if (!L->slices) return 0;
    if (dt_comm_rank(L->slices) != 0)
        return dt_send(L->slices, m->params, m->n_floats, DT_F32, 0)
                   ? failed(L, "gathering the parameters", L->slices) : 0;
    if (!L->whole->params && dt_gpt_alloc_params(L->whole))
        return failed(L, "the whole parameters", NULL);
    if (place_slice(L, m, m->params)) return -1;
    for (int k = 1; k < dt_comm_size(L->slices); k++)
        if (receive_slice(L, k)) return -1;
    return 0;
}

/* The whole tensors must be the same bits on every rank of the group. */
static int ep_replicas(void *self, uint64_t *hash)
{
    ep_layer *L = self;
    const uint64_t h = dt_slices_hash(L->m, is_shared);
    int64_t lo = (int64_t)h, hi = (int64_t)h;
    int same = dt_fingerprints_agree(L->ep, &lo, &hi, 1);
    if (same < 0) return failed(L, "comparing the whole tensors", L->ep);
    if (!L->replicated && hash) *hash = h;
    return same;
}

/* Every rank of a group runs the same batches (its exchanges pair up);
 * the groups split them. */
static int ep_eval_group(void *self, int final, dt_comm **group)
{
    ep_layer *L = self;
    (void)final;
    *group = L->edp;
    return 1;
}

static void ep_describe(void *self, FILE *f)
{
    ep_layer *L = self;
    const dt_gpt_ep *e = &L->m->ep;
    fprintf(f, "\n  expert parallel: %d ranks per group (%s), this rank experts [%d, %d) of %d",
            L->size, dt_comm_transport(L->ep), e->e0, e->e0 + e->experts,
            L->m->cfg.moe.experts);
}

int dt_ep_rank_mem(const dt_gpt *layout, int q, int ep, int B, int T, dt_rank_mem *out,
                   char *err, size_t errlen)
{
    dt_gpt lay;
    if (dt_gpt_ep_peer_layout(layout, q, ep, &lay, err, errlen)) return -1;
    dt_places_layout_mem(&lay, B, T, out);
    dt_gpt_destroy(&lay);
    return 0;
}

static int ep_mem_plan(void *self, int q, dt_rank_mem *out)
{
    ep_layer *L = self;
    dt_rank *r = L->S->rank;
    if (L->S->held) return 0;
    if (dt_ep_rank_mem(L->m, q % L->size, L->size, r->B, r->T, out, r->err, sizeof r->err))
        return -1;
    out->copies = L->copies;
    return 1;
}

static void ep_destroy(void *self)
{
    ep_layer *L = self;
    if (L->own_whole.tensors) dt_gpt_destroy(&L->own_whole);
    free(L->map);
    free(L->own);
    free(L->own_within);
    if (L->queue) drain(L, 0);
    if (L->rows.req) dt_wait(L->rows.req); /* a failed layer left one in flight */
    free(L->queue);
    free(L->dense);
    free(L);
}

static const dt_strategy_ops ep_ops = {
    .name = "ep",
    .relayout = ep_relayout,
    .plan = ep_plan,
    .begin_step = ep_begin_step,
    .before_backward = ep_before_backward,
    .end_grads = ep_end_grads,
    .traffic = ep_traffic,
    .gather_params = ep_gather_params,
    .replicas_identical = ep_replicas,
    .eval_group = ep_eval_group,
    .describe_lines = ep_describe,
    .mem_plan = ep_mem_plan,
    .destroy = ep_destroy,
};

int dt_ep_layer(dt_strategy *S, const dt_mesh *g)
{
    dt_rank *r = S->rank;
    ep_layer *L = calloc(1, sizeof *L);
    if (!L) return dt_strf(r->err, sizeof r->err, "expert parallelism: out of memory"), -1;
    L->S = S;
    L->ep = g->ep_group;
    L->edp = g->edp_group;
    L->me = g->ep_i;
    L->size = g->ep;
    L->slices = g->slices;
    L->tp = g->tp;
    L->replicated = g->replicas != NULL;
    L->copies = g->cp * g->dp / g->ep;
    S->grad_ranks *= g->ep; /* the whole tensors' sums; the experts' came with the rows */
    if (dt_strategy_add_norm_group(S, L->ep))
        return ep_destroy(L), dt_strf(r->err, sizeof r->err, "expert parallelism: too many "
                                      "layers"), -1;
    return dt_strategy_add(S, &ep_ops, L);
}
