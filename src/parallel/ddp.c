/* DDP: bucketed, overlapped gradient all-reduce. See ddp.h. */
#include "parallel/ddp.h"

#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/timer.h"
#include "parallel/fingerprint.h"

/* Segments are grouped from the last (finished first) down, a bucket
 * closing once it holds bucket_bytes: a bucket is then a contiguous range. */
int dt_ddp_init(dt_ddp *d, dt_comm *c, dt_gpt *m, size_t bucket_bytes)
{
    memset(d, 0, sizeof *d);
    d->comm = c;
    d->model = m;
    int nseg = dt_gpt_segments(m);
    d->buckets = calloc((size_t)nseg, sizeof *d->buckets);
    if (!d->buckets) return DT_ERR_NOMEM;
    size_t want = bucket_bytes / sizeof(float);
    dt_ddp_bucket *b = NULL;
    for (int s = nseg - 1; s >= 0; s--) {
        size_t lo = dt_gpt_segment_start(m, s), hi = dt_gpt_segment_start(m, s + 1);
        if (!b || b->hi - b->lo >= want) {
            b = &d->buckets[d->nbuckets++];
            b->hi = hi;
        }
        b->lo = lo;
        b->segments++;
    }
    m->grad_ready = NULL;
    m->grad_ready_ctx = d;
    return 0;
}

void dt_ddp_free(dt_ddp *d)
{
    if (d->model && d->model->grad_ready_ctx == d) d->model->grad_ready = NULL;
    free(d->buckets);
    memset(d, 0, sizeof *d);
}

static dt_ddp_bucket *bucket_of(dt_ddp *d, size_t lo)
{
    for (int i = 0; i < d->nbuckets; i++)
        if (lo >= d->buckets[i].lo && lo < d->buckets[i].hi) return &d->buckets[i];
    return NULL;
}

/* The model's hook: a segment is final; a bucket whose segments all are
 * starts its all-reduce on the progress thread. */
static void on_grad_ready(void *ctx, size_t lo, size_t hi)
{
    dt_ddp *d = ctx;
    dt_ddp_bucket *b = bucket_of(d, lo);
    if (!b || hi <= lo || ++b->ready < b->segments || d->error) return;
    float *g = d->model->grads + b->lo;
    int rc = dt_iallreduce(d->comm, g, g, b->hi - b->lo, DT_F32, DT_AVG, &b->req);
    if (rc != 0) d->error = rc;
}

void dt_ddp_begin_backward(dt_ddp *d, int communicate)
{
    d->communicate = communicate;
    d->error = 0;
    for (int i = 0; i < d->nbuckets; i++) d->buckets[i].ready = 0;
    d->model->grad_ready = communicate ? on_grad_ready : NULL;
    if (communicate) d->bytes_sent = dt_comm_bytes_sent(d->comm);
}

int dt_ddp_finish(dt_ddp *d)
{
    d->model->grad_ready = NULL;
    if (!d->communicate) return 0;
    d->backward_end_ns = dt_now_ns();
    int rc = d->error;
    for (int i = 0; i < d->nbuckets; i++) {
        dt_ddp_bucket *b = &d->buckets[i];
        if (!b->req) continue;
        int w = dt_wait_timed(b->req, &b->start_ns, &b->end_ns);
        b->req = NULL;
        if (rc == 0) rc = w;
    }
    d->wait_ms = (double)(dt_now_ns() - d->backward_end_ns) * 1e-6;
    d->bytes_sent = dt_comm_bytes_sent(d->comm) - d->bytes_sent;
    if (rc == 0 && d->error == 0) {
        for (int i = 0; i < d->nbuckets; i++)
            if (d->buckets[i].ready < d->buckets[i].segments) return DT_ERR_INVALID; /* a segment never reported */
    }
    return rc;
}

int dt_ddp_broadcast_params(dt_ddp *d)
{
    float *p = d->model->params;
    return dt_broadcast(d->comm, p, p, d->model->n_floats, DT_F32, 0);
}

int dt_ddp_replicas_identical(dt_ddp *d, uint64_t *hash_out)
{
    uint64_t h = dt_fnv1a64(d->model->params, d->model->n_floats * sizeof(float));
    int64_t lo = (int64_t)h, hi = (int64_t)h;
    int same = dt_fingerprints_agree(d->comm, &lo, &hi, 1);
    if (same >= 0 && hash_out) *hash_out = h;
    return same;
}
