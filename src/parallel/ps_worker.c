/* Parameter server, the worker side. See ps_worker.h and ps.h.
 *
 * What a worker sends a server s on its link, per step: the STEP control
 * message, s's pieces in piece order (floats, or dt_compress_bytes bytes),
 * then the trailer (the local gradient's sum of squares). What comes back:
 * the norm the update clipped with, then s's shard of the parameters. */
#include "parallel/ps_worker.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/str.h"
#include "core/timer.h"
#include "kernels/optimizer.h"

int dt_ps_worker_init(dt_ps_worker *w, dt_ps *ps, dt_gpt *m, char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    w->ps = ps;
    w->model = m;
    w->link = ps->links[0];
    w->pushes = calloc((size_t)ps->npieces, sizeof *w->pushes);
    w->enc_off = calloc((size_t)ps->npieces + 1, sizeof *w->enc_off);
    if (!w->pushes || !w->enc_off) goto oom;
    if (ps->compress.kind != DT_COMPRESS_NONE) {
        for (int p = 0; p < ps->npieces; p++)
            w->enc_off[p + 1] = w->enc_off[p] + dt_compress_bytes(&ps->compress,
                                                                 ps->pieces[p].hi - ps->pieces[p].lo);
        w->encoded = dt_alloc(w->enc_off[ps->npieces], DT_MEM_COMM);
        w->residual = dt_alloc(m->n_floats * sizeof(float), DT_MEM_COMM);
        if (!w->encoded || !w->residual) goto oom;
        memset(w->residual, 0, m->n_floats * sizeof(float));
    }
    m->hooks.grad_ready = NULL;
    m->hooks.grad_ctx = w;
    return 0;
oom:
    dt_strf(err, errlen, "parameter server worker: out of memory for its push buffers");
    dt_ps_worker_free(w);
    return -1;
}

void dt_ps_worker_free(dt_ps_worker *w)
{
    if (w->model && w->model->hooks.grad_ctx == w) w->model->hooks.grad_ready = NULL;
    free(w->pushes);
    free(w->enc_off);
    dt_free(w->encoded);
    dt_free(w->residual);
    memset(w, 0, sizeof *w);
}

static int send_ctrl_all(dt_ps_worker *w, int64_t kind, int64_t step, int64_t arg)
{
    for (int s = 0; s < w->ps->servers; s++) {
        int rc = dt_ps_send_ctrl(w->link, dt_ps_server_peer(s), kind, step, arg);
        if (rc != 0) return rc;
    }
    return 0;
}

/* Every server's shard of a buffer of the flat layout, received from (or
 * sent to) all servers at once: the messages of one step progress together. */
static int move_shards(dt_ps_worker *w, float *buf, dt_request **reqs, int send)
{
    int rc = 0;
    for (int s = 0; s < w->ps->servers && rc == 0; s++) {
        float *shard = buf + w->ps->shard_lo[s];
        size_t n = dt_ps_shard_len(w->ps, s);
        int peer = dt_ps_server_peer(s);
        rc = send ? dt_isend(w->link, shard, n, DT_F32, peer, &reqs[s])
                  : dt_irecv(w->link, shard, n, DT_F32, peer, &reqs[s]);
    }
    int rw = dt_ps_wait_all(reqs, w->ps->servers);
    return rc ? rc : rw;
}

static int recv_shards(dt_ps_worker *w, float *buf, dt_request **reqs)
{
    return move_shards(w, buf, reqs, 0);
}

static int send_shards(dt_ps_worker *w, const float *buf, dt_request **reqs)
{
    return move_shards(w, (float *)buf, reqs, 1); /* only read when sending */
}

static dt_request **scratch_reqs(dt_ps_worker *w)
{
    /* The push slots are free outside a step; there is one per piece, and
     * at least one piece per server. */
    return w->pushes;
}

int dt_ps_worker_init_servers(dt_ps_worker *w, const dt_optimizer *o, long step)
{
    int rc = send_ctrl_all(w, DT_PS_INIT, step, o ? o->t : -1);
    if (rc == 0) rc = send_shards(w, w->model->params, scratch_reqs(w));
    if (rc == 0 && o && o->m) rc = send_shards(w, o->m, scratch_reqs(w));
    if (rc == 0 && o && o->v) rc = send_shards(w, o->v, scratch_reqs(w));
    return rc;
}

int dt_ps_worker_begin_step(dt_ps_worker *w, long step)
{
    w->step = step;
    w->bytes_sent = dt_comm_bytes_sent(w->link);
    return send_ctrl_all(w, DT_PS_STEP, step, 0);
}

static void push_piece(dt_ps_worker *w, int p)
{
    const dt_ps_piece *pc = &w->ps->pieces[p];
    size_t n = pc->hi - pc->lo;
    int peer = dt_ps_server_peer(pc->server), rc;
    const void *msg = w->model->grads + pc->lo;
    if (w->ps->compress.kind != DT_COMPRESS_NONE) {
        unsigned char *out = w->encoded + w->enc_off[p];
        dt_compress_encode(&w->ps->compress, msg, w->residual + pc->lo, n, out);
        msg = out;
    }
    dt_dtype type;
    size_t count;
    dt_ps_push_format(w->ps, n, &type, &count);
    rc = dt_isend(w->link, msg, count, type, peer, &w->pushes[p]);
    if (rc != 0 && w->error == 0) w->error = rc;
}

/* The model's hook: a segment is final, so are the pieces cut from it. */
static void on_grad_ready(void *ctx, size_t lo, size_t hi)
{
    dt_ps_worker *w = ctx;
    const dt_ps *ps = w->ps;
    while (w->next_piece < ps->npieces && ps->pieces[w->next_piece].lo >= lo &&
           ps->pieces[w->next_piece].hi <= hi)
        push_piece(w, w->next_piece++);
}

void dt_ps_worker_begin_backward(dt_ps_worker *w, int communicate)
{
    w->communicate = communicate;
    w->error = 0;
    w->next_piece = 0;
    w->model->hooks.grad_ready = communicate ? on_grad_ready : NULL;
}

/* The norm each server clipped with (the same from all in synchronous
 * mode), then the parameters. */
static int recv_update(dt_ps_worker *w)
{
    int S = w->ps->servers, rc = 0;
    double *norms = calloc((size_t)S, sizeof *norms);
    if (!norms) return DT_ERR_NOMEM;
    dt_request **reqs = scratch_reqs(w);
    for (int s = 0; s < S && rc == 0; s++)
        rc = dt_irecv(w->link, &norms[s], 1, DT_F64, dt_ps_server_peer(s), &reqs[s]);
    int rw = dt_ps_wait_all(reqs, S);
    if (rc == 0) rc = rw;
    if (rc == 0) rc = recv_shards(w, w->model->params, reqs);
    w->norm = norms[0];
    free(norms);
    return rc;
}

int dt_ps_worker_finish(dt_ps_worker *w)
{
    dt_gpt *m = w->model;
    m->hooks.grad_ready = NULL;
    uint64_t t0 = dt_now_ns();
    int rc = w->error;
    if (rc == 0 && w->next_piece != w->ps->npieces) rc = DT_ERR_INVALID; /* a segment never reported */
    int rw = dt_ps_wait_all(w->pushes, w->ps->npieces);
    if (rc == 0) rc = rw;
    /* Asynchronous servers clip each push by its own worker's norm;
     * synchronous ones compute the norm of the mean themselves, so the
     * pass over the gradient is skipped on their critical path. */
    double sumsq = w->ps->async ? dt_sum_squares(m->grads, m->n_floats) : 0;
    for (int s = 0; s < w->ps->servers && rc == 0; s++)
        rc = dt_send(w->link, &sumsq, 1, DT_F64, dt_ps_server_peer(s));
    if (rc == 0) rc = recv_update(w);
    w->wait_ms = (double)(dt_now_ns() - t0) * 1e-6;
    w->bytes_sent = dt_comm_bytes_sent(w->link) - w->bytes_sent;
    return rc;
}

int dt_ps_worker_pull(dt_ps_worker *w)
{
    int rc = send_ctrl_all(w, DT_PS_PULL, w->step, 0);
    return rc ? rc : recv_shards(w, w->model->params, scratch_reqs(w));
}

int dt_ps_worker_fetch(dt_ps_worker *w, dt_optimizer *o)
{
    int S = w->ps->servers;
    int rc = send_ctrl_all(w, DT_PS_FETCH, w->step, 0);
    if (rc == 0) rc = recv_shards(w, w->model->params, scratch_reqs(w));
    if (rc == 0 && o->m) rc = recv_shards(w, o->m, scratch_reqs(w));
    if (rc == 0 && o->v) rc = recv_shards(w, o->v, scratch_reqs(w));
    /* Every server has taken the same number of steps; server 0's count is kept. */
    for (int s = 0; s < S && rc == 0; s++) {
        int64_t t;
        rc = dt_recv(w->link, &t, 1, DT_I64, dt_ps_server_peer(s));
        if (rc == 0 && s == 0) o->t = (long)t;
    }
    return rc;
}

int dt_ps_worker_done(dt_ps_worker *w) { return send_ctrl_all(w, DT_PS_DONE, w->step, 0); }

int dt_ps_worker_stop(dt_ps_worker *w) { return send_ctrl_all(w, DT_PS_STOP, w->step, 0); }
