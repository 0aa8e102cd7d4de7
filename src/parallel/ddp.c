/* DDP: bucketed, overlapped gradient all-reduce. See ddp.h. */
#include "parallel/ddp.h"

#include <stdlib.h>
#include <string.h>

#include "core/fault.h"
#include "core/sum.h"
#include "core/str.h"
#include "core/trace.h"
#include "core/timer.h"
#include "parallel/fingerprint.h"
#include "parallel/registry.h"

/* Segments are grouped from the last (finished first) down, a bucket
 * closing once it holds bucket_bytes: a bucket is then a contiguous range. */
int dt_ddp_init(dt_ddp *d, dt_comm *c, dt_gpt *m, size_t bucket_bytes,
                const dt_flat_ranges *held_ranges)
{
    memset(d, 0, sizeof *d);
    d->comm = c;
    d->model = m;
    d->held = held_ranges;
    int nseg = dt_gpt_segments(m);
    d->buckets = calloc((size_t)nseg, sizeof *d->buckets);
    if (!d->buckets) return DT_ERR_NOMEM;
    size_t want = bucket_bytes / sizeof(float);
    dt_ddp_bucket *b = NULL;
    for (int s = nseg - 1; s >= 0; s--) {
        size_t lo = dt_gpt_segment_start(m, s), hi = dt_gpt_segment_start(m, s + 1);
        if (!dt_flat_ranges_cover(held_ranges, lo, hi)) {
            b = NULL; /* a gap: the next bucket starts afresh */
            continue;
        }
        if (!b || b->hi - b->lo >= want) {
            b = &d->buckets[d->nbuckets++];
            b->hi = hi;
        }
        b->lo = lo;
        b->segments++;
    }
    m->hooks.grad_ready = NULL;
    m->hooks.grad_ctx = d;
    return 0;
}

void dt_ddp_free(dt_ddp *d)
{
    if (d->model && d->model->hooks.grad_ctx == d) d->model->hooks.grad_ready = NULL;
    for (int i = 0; i < d->nbuckets; i++) {
        if (d->buckets[i].req && d->buckets[i].wire.copy) dt_wait(d->buckets[i].req); /* it reads the copy */
        dt_wire_close(&d->buckets[i].wire);
    }
    free(d->buckets);
    memset(d, 0, sizeof *d);
}

static dt_ddp_bucket *bucket_of(dt_ddp *d, size_t lo)
{
    for (int i = 0; i < d->nbuckets; i++)
        if (lo >= d->buckets[i].lo && lo < d->buckets[i].hi) return &d->buckets[i];
    return NULL;
}

/* A bucket's all-reduce has ended (rc): its result in from the copy, if
 * it travelled as one (which is then given back). */
static int complete(dt_ddp *d, dt_ddp_bucket *b, int rc)
{
    b->req = NULL;
    if (rc == 0 && b->start_ns && dt_trace_on()) {
        dt_trace_args ta = dt_trace_noargs();
        ta.bytes = (long long)((b->hi - b->lo) * dt_dtype_size(d->wire));
        dt_trace_add(DT_TRACE_COMM, "allreduce", b->start_ns, b->end_ns, &ta);
    }
    if (rc == 0)
        dt_wire_result(&b->wire, 0, dt_gbuf_at(dt_gpt_grads(d->model), b->lo), b->hi - b->lo);
    dt_wire_close(&b->wire);
    return rc;
}

/* Copies whose all-reduce is done, taken in now rather than at the end of
 * backward: the copies in flight stay a few buckets, not all of them. */
static void harvest(dt_ddp *d)
{
    for (int i = 0; i < d->nbuckets && d->error == 0; i++) {
        dt_ddp_bucket *b = &d->buckets[i];
        int done = 0;
        if (!b->req || !b->wire.copy) continue;
        int rc = dt_test_timed(b->req, &done, &b->start_ns, &b->end_ns);
        if (done || rc) d->error = complete(d, b, rc);
    }
}

/* The model's hook: a segment is final; a bucket whose segments all are
 * starts its all-reduce on the progress thread. */
static void on_grad_ready(void *ctx, size_t lo, size_t hi)
{
    dt_ddp *d = ctx;
    dt_ddp_bucket *b = bucket_of(d, lo);
    if (!b || hi <= lo || ++b->ready < b->segments || d->error) return;
    harvest(d);
    size_t n = b->hi - b->lo;
    if (dt_wire_open(&b->wire, dt_gbuf_at(dt_gpt_grads(d->model), b->lo), n, d->wire)) {
        d->error = DT_ERR_NOMEM;
        return;
    }
    /* Each rank's share is weighed already (dt_strategy.grad_ranks). */
    dt_fault_point("allreduce");
    int rc = dt_iallreduce(d->comm, b->wire.buf, b->wire.buf, n, d->wire, DT_SUM, &b->req);
    if (rc != 0) d->error = rc;
}

void dt_ddp_begin_backward(dt_ddp *d, int communicate)
{
    d->communicate = communicate;
    d->model->hooks.grad_ready = communicate ? on_grad_ready : NULL;
    if (!communicate || d->step_open) return;
    d->step_open = 1;
    d->error = 0;
    d->bytes_sent = dt_comm_bytes_sent(d->comm);
}

int dt_ddp_finish(dt_ddp *d)
{
    d->model->hooks.grad_ready = NULL;
    if (!d->step_open) return 0;
    d->step_open = 0;
    d->backward_end_ns = dt_now_ns();
    int rc = d->error;
    for (int i = 0; i < d->nbuckets; i++) {
        dt_ddp_bucket *b = &d->buckets[i];
        if (!b->req) continue;
        int w = complete(d, b, dt_wait_timed(b->req, &b->start_ns, &b->end_ns));
        if (rc == 0) rc = w;
    }
    d->wait_ms = (double)(dt_now_ns() - d->backward_end_ns) * 1e-6;
    d->bytes_sent = dt_comm_bytes_sent(d->comm) - d->bytes_sent;
    for (int i = 0; i < d->nbuckets; i++) {
        if (rc == 0 && d->error == 0 && d->buckets[i].ready < d->buckets[i].segments)
            rc = DT_ERR_INVALID; /* a segment never reported */
        d->buckets[i].ready = 0;
    }
    return rc;
}

/* Calls fn on each range of the parameters this rank holds. */
static int each_held(const dt_ddp *d, int (*fn)(const dt_ddp *d, size_t lo, size_t hi, void *arg),
                     void *arg)
{
    if (!d->held) return fn(d, 0, d->model->n_floats, arg);
    for (int i = 0; i < d->held->n; i++) {
        int rc = fn(d, d->held->r[i].lo, d->held->r[i].hi, arg);
        if (rc) return rc;
    }
    return 0;
}

static int broadcast_range(const dt_ddp *d, size_t lo, size_t hi, void *arg)
{
    (void)arg;
    float *p = d->model->params + lo;
    return dt_broadcast(d->comm, p, p, hi - lo, DT_F32, 0);
}

int dt_ddp_broadcast_params(dt_ddp *d) { return each_held(d, broadcast_range, NULL); }

static int hash_range(const dt_ddp *d, size_t lo, size_t hi, void *arg)
{
    uint64_t *h = arg;
    *h ^= dt_sum64(d->model->params + lo, (hi - lo) * sizeof(float)) + 0x9E3779B97F4A7C15ull +
          (*h << 6) + (*h >> 2);
    return 0;
}

int dt_ddp_replicas_identical(dt_ddp *d, uint64_t *hash_out)
{
    uint64_t h = 0;
    if (d->held) {
        each_held(d, hash_range, &h);
    } else {
        h = dt_sum64(d->model->params, d->model->n_floats * sizeof(float));
    }
    int64_t lo = (int64_t)h, hi = (int64_t)h;
    int same = dt_fingerprints_agree(d->comm, &lo, &hi, 1);
    if (same >= 0 && hash_out) *hash_out = h;
    return same;
}

/* ---- DDP as a strategy layer ---------------------------------------------- */

typedef struct {
    dt_ddp d;
    dt_strategy *S;
    dt_comm *comm; /* the data-parallel group: the job, or a sub-group it owns */
    int owns_comm;
    size_t bucket_bytes;
    dt_dtype wire;
} ddp_layer;

static int ddp_failed(ddp_layer *L, const char *what)
{
    dt_rank *r = L->S->rank;
    return dt_strf(r->err, sizeof r->err, "%s: %s", what, dt_comm_error(L->comm)), -1;
}

/* Every rank starts from rank 0's weights and checks that it holds them. */
static int ddp_start(void *self, dt_rank *r)
{
    ddp_layer *L = self;
    if (dt_ddp_init(&L->d, L->comm, r->model, L->bucket_bytes, L->S->held))
        return ddp_failed(L, "DDP setup");
    L->d.wire = L->wire;
    if (dt_ddp_broadcast_params(&L->d)) return ddp_failed(L, "DDP setup");
    int same = dt_ddp_replicas_identical(&L->d, NULL);
    if (same < 0) return ddp_failed(L, "DDP setup");
    if (!same)
        return dt_strf(r->err, sizeof r->err, "after the broadcast the ranks' weights differ"),
               -1;
    return 0;
}

static void ddp_before_backward(void *self, int micro, int last)
{
    (void)micro;
    dt_ddp_begin_backward(&((ddp_layer *)self)->d, last);
}

static int ddp_end_grads(void *self)
{
    ddp_layer *L = self;
    return dt_ddp_finish(&L->d) ? ddp_failed(L, "gradient all-reduce") : 0;
}

static void ddp_traffic(void *self, double *comm_ms, uint64_t *bytes)
{
    ddp_layer *L = self;
    *comm_ms = L->d.wait_ms;
    *bytes = L->d.bytes_sent;
}

static int ddp_replicas(void *self, uint64_t *hash)
{
    ddp_layer *L = self;
    int same = dt_ddp_replicas_identical(&L->d, hash);
    return same < 0 ? ddp_failed(L, "comparing replicas") : same;
}

static void ddp_describe(void *self, FILE *f)
{
    ddp_layer *L = self;
    dt_strategy_describe_blocks(L->S, f, dt_comm_size(L->d.comm));
    fprintf(f, "DDP over %s, %d buckets of ~%g MiB, gradients accumulated in %s, "
            "reduced in %s)", dt_comm_transport(L->d.comm),
            L->d.nbuckets, (double)L->bucket_bytes / 1048576.0,
            L->d.model->accum.bf16 ? "bf16" : "fp32", L->wire == DT_BF16 ? "bf16" : "fp32");
}

/* Every rank of the group holds the model whole, as the ZeRO formulas'
 * stage 0 says (a layer above that splits the model answers first). */
static int ddp_mem_plan(void *self, int r, dt_rank_mem *out)
{
    (void)r;
    *out = (dt_rank_mem){.floats = 0, .copies = dt_comm_size(((ddp_layer *)self)->comm)};
    return 1;
}

static void ddp_destroy(void *self)
{
    ddp_layer *L = self;
    dt_ddp_free(&L->d);
    if (L->owns_comm) dt_comm_destroy(L->comm);
    free(L);
}

static const dt_strategy_ops ddp_ops = {
    .name = "ddp",
    .start = ddp_start,
    .before_backward = ddp_before_backward,
    .end_grads = ddp_end_grads,
    .traffic = ddp_traffic,
    .replicas_identical = ddp_replicas,
    .describe = ddp_describe,
    .mem_plan = ddp_mem_plan,
    .destroy = ddp_destroy,
};

int dt_ddp_strategy_on(dt_strategy *S, dt_comm *group, int owns, size_t bucket_bytes,
                       dt_dtype wire)
{
    dt_rank *r = S->rank;
    ddp_layer *L = calloc(1, sizeof *L);
    if (!L) {
        if (owns) dt_comm_destroy(group);
        return dt_strf(r->err, sizeof r->err, "DDP: out of memory"), -1;
    }
    L->S = S;
    L->comm = group;
    L->owns_comm = owns;
    L->bucket_bytes = bucket_bytes;
    L->wire = wire;
    S->lockstep = r->world;
    dt_strategy_dp_blocks(S, group);
    return dt_strategy_add(S, &ddp_ops, L);
}

/* Over the whole job: every rank takes its block of each batch, and all of
 * them step together. */
int dt_ddp_strategy(dt_strategy *S, size_t bucket_bytes, dt_dtype wire)
{
    S->replicas = S->rank->world;
    return dt_ddp_strategy_on(S, S->rank->world, 0, bucket_bytes, wire);
}
