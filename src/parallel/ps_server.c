/* Parameter server, the server side. See ps_server.h and ps.h.
 *
 * Synchronous mode: each worker's thread receives its pushes into the
 * worker's inbox; the last of the W threads to arrive sums the inboxes in
 * worker order (so the result does not depend on arrival order), averages,
 * agrees on the global norm with the other servers, and runs the optimizer
 * once; then every thread answers its worker with the same parameters.
 *
 * Asynchronous mode: each thread decodes its worker's push and applies it
 * at once, under the shard's lock, clipped by that worker's own norm. It
 * answers when its worker is no more than `staleness` steps ahead of the
 * slowest one still running. With a fixed staleness K (ps.h) a thread
 * instead waits for its worker's turn (every worker's previous step in, and
 * this step of the workers before it), and answers with the shard as it
 * stood after step + 1 - K, kept in a ring of the last K + 1 steps. */
#include "parallel/ps_server.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/str.h"
#include "kernels/optimizer.h"

typedef struct server server;

typedef struct {
    server *srv;
    int w;         /* the worker this thread serves */
    dt_comm *link;
    unsigned char *inbox; /* its pushes, this server's pieces back to back */
    float *dense;         /* async: the decoded push */
    float *snapshot;      /* async: the parameters its reply carries */
    double sumsq;         /* the worker's gradient, from the trailer */
    int rc;
} worker_slot;

struct server {
    const dt_ps_server_args *a;
    dt_ps *ps;
    int s;           /* this server's index */
    size_t lo, n;    /* its shard */
    float *params;   /* the shard */
    float *acc;      /* sync: the mean push */
    int nmine;
    int *mine;       /* indices of this server's pieces, in push order */
    size_t *in_off;  /* offset of each of them in an inbox (nmine + 1) */
    worker_slot *slots;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;     /* sync: pushes of the current step in */
    long generation; /* sync: updates done */
    double norm;     /* sync: of the last update */
    long *clock;     /* async: steps each worker has pushed; LONG_MAX once stopped */
    long first;      /* async: the step the run started at */
    long round;      /* fixed: the last step every worker's pushes are in for */
    float *rounds;   /* fixed: the shard after each of the last K + 1 such steps */
    long updates;
    int failed;      /* a thread failed: the others stop waiting */
    char err[512];
};

static size_t piece_len(const server *v, int i)
{
    const dt_ps_piece *p = &v->ps->pieces[v->mine[i]];
    return p->hi - p->lo;
}

static size_t piece_bytes(const server *v, int i)
{
    return dt_compress_bytes(&v->ps->compress, piece_len(v, i));
}

static void fail(server *v, const char *what, dt_comm *c)
{
    pthread_mutex_lock(&v->mu);
    if (!v->failed)
        dt_strf(v->err, sizeof v->err, "parameter server %d: %s: %s", v->s, what,
                c ? dt_comm_error(c) : "out of memory");
    v->failed = 1;
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
}

/* ---- messages ------------------------------------------------------------ */

/* The pieces of one push, then its trailer, all posted at once. */
static int recv_push(server *v, worker_slot *ws)
{
    int n = v->nmine, rc = 0;
    dt_request **reqs = calloc((size_t)n + 1, sizeof *reqs);
    if (!reqs) return DT_ERR_NOMEM;
    for (int i = 0; i < n && rc == 0; i++) {
        dt_dtype type;
        size_t count;
        dt_ps_push_format(v->ps, piece_len(v, i), &type, &count);
        rc = dt_irecv(ws->link, ws->inbox + v->in_off[i], count, type, 0, &reqs[i]);
    }
    if (rc == 0) rc = dt_irecv(ws->link, &ws->sumsq, 1, DT_F64, 0, &reqs[n]);
    int rw = dt_ps_wait_all(reqs, n + 1);
    free(reqs);
    return rc ? rc : rw;
}

/* buf (n floats of the shard) += the decoded push of one inbox. */
static void add_push(server *v, const unsigned char *inbox, float *buf)
{
    for (int i = 0; i < v->nmine; i++) {
        const dt_ps_piece *p = &v->ps->pieces[v->mine[i]];
        dt_compress_decode_add(&v->ps->compress, inbox + v->in_off[i], p->hi - p->lo,
                               buf + (p->lo - v->lo));
    }
}

static int send_update(worker_slot *ws, double norm, const float *params, size_t n)
{
    int rc = dt_send(ws->link, &norm, 1, DT_F64, 0);
    return rc ? rc : dt_send(ws->link, params, n, DT_F32, 0);
}

/* ---- updates ------------------------------------------------------------- */

/* One update with grads x scale, clipped to the norm of that product. */
static void apply(server *v, const float *grads, float scale, double norm, long step)
{
    const dt_ps_server_args *a = v->a;
    if (!isfinite(norm)) return; /* the worker reports it and stops; the shard stays good */
    float coef = dt_clip_coef(norm, a->grad_clip) * scale;
    dt_optimizer_step(a->opt, a->layout, v->params, dt_gbuf_f32((float *)grads), v->lo,
                      v->lo + v->n, a->lr_at(a->lr_ctx, step), coef);
    v->updates++;
}

/* The last thread in: the sum over workers, the global norm of their
 * mean, one update. The 1/W of the mean rides on the clipping coefficient
 * rather than costing a pass of its own. */
static int sync_update(server *v, long step)
{
    memset(v->acc, 0, v->n * sizeof(float));
    for (int w = 0; w < v->ps->workers; w++) add_push(v, v->slots[w].inbox, v->acc);
    const float inv = 1.0f / (float)v->ps->workers;
    double sumsq = dt_sum_squares(v->acc, v->n);
    if (v->ps->servers > 1) {
        int rc = dt_allreduce(v->ps->role, &sumsq, &sumsq, 1, DT_F64, DT_SUM);
        if (rc != 0) return rc;
    }
    v->norm = sqrt(sumsq) * inv;
    apply(v, v->acc, inv, v->norm, step);
    return 0;
}

static int sync_step(server *v, worker_slot *ws, long step)
{
    pthread_mutex_lock(&v->mu);
    long gen = v->generation;
    int rc = 0;
    if (++v->arrived == v->ps->workers) {
        rc = sync_update(v, step);
        v->arrived = 0;
        v->generation++;
        if (rc != 0) {
            dt_strf(v->err, sizeof v->err, "parameter server %d: agreeing on the norm: %s",
                    v->s, dt_comm_error(v->ps->role));
            v->failed = 1;
        }
        pthread_cond_broadcast(&v->cv);
    }
    while (v->generation == gen && !v->failed) pthread_cond_wait(&v->cv, &v->mu);
    double norm = v->norm;
    int failed = v->failed;
    pthread_mutex_unlock(&v->mu);
    if (failed) return DT_ERR_ABORTED;
    return send_update(ws, norm, v->params, v->n);
}

static long slowest_clock(const server *v)
{
    long lo = LONG_MAX;
    for (int w = 0; w < v->ps->workers; w++)
        if (v->clock[w] < lo) lo = v->clock[w];
    return lo;
}

/* fixed: the shard as it stood once every worker's pushes before step
 * `round` were in. */
static float *round_params(const server *v, long round)
{
    return v->rounds + (size_t)(round % (v->ps->staleness + 1)) * v->n;
}

/* fixed: the steps every worker has now pushed enter the ring. A worker
 * that stopped early completes several at once; those all hold the shard
 * as it is. */
static void keep_rounds(server *v)
{
    long done = slowest_clock(v);
    if (done == LONG_MAX) return; /* every worker has stopped */
    long from = done - v->ps->staleness;
    for (long r = from > v->round + 1 ? from : v->round + 1; r <= done; r++)
        memcpy(round_params(v, r), v->params, v->n * sizeof(float));
    if (done > v->round) v->round = done;
}

/* fixed: worker w's push of `step` comes after this step's pushes of the
 * workers before it and the previous step's of those after it. */
static int my_turn(const server *v, int w, long step)
{
    for (int u = 0; u < v->ps->workers; u++)
        if (v->clock[u] < step + (u < w)) return 0;
    return 1;
}

/* Under the lock, after worker w's push of `step`: the parameters of its
 * next step, once they exist. A worker whose clock is past the slowest by
 * more than the bound waits here: it cannot start its next step. With a
 * fixed staleness it waits for the shard of step + 1 - K instead. */
static const float *await_params(server *v, int w, long step)
{
    if (!v->ps->fixed) {
        while (!v->failed && v->clock[w] - slowest_clock(v) > v->ps->staleness)
            pthread_cond_wait(&v->cv, &v->mu);
        return v->params;
    }
    long want = step + 1 - v->ps->staleness;
    if (want < v->first) want = v->first;
    while (!v->failed && v->round < want) pthread_cond_wait(&v->cv, &v->mu);
    return round_params(v, want);
}

static int async_step(server *v, worker_slot *ws, long step)
{
    memset(ws->dense, 0, v->n * sizeof(float));
    add_push(v, ws->inbox, ws->dense);
    double norm = sqrt(ws->sumsq);
    pthread_mutex_lock(&v->mu);
    while (v->ps->fixed && !v->failed && !my_turn(v, ws->w, step))
        pthread_cond_wait(&v->cv, &v->mu);
    apply(v, ws->dense, 1.0f, norm, step);
    v->clock[ws->w] = step + 1;
    if (v->ps->fixed) keep_rounds(v);
    pthread_cond_broadcast(&v->cv);
    memcpy(ws->snapshot, await_params(v, ws->w, step), v->n * sizeof(float));
    int failed = v->failed;
    pthread_mutex_unlock(&v->mu);
    if (failed) return DT_ERR_ABORTED;
    return send_update(ws, norm, ws->snapshot, v->n);
}

/* ---- control ------------------------------------------------------------- */

/* Parameters, and for FETCH the moments and step count, as they stand.
 * With a fixed staleness, what stands must not depend on how far the other
 * workers got: a PULL takes the last step every worker's pushes are in for,
 * and a FETCH after `step` waits for all of that step's (no worker can push
 * the next one before the fetching worker does). Once every worker is done
 * pushing, all that was pushed stands. */
static int send_state(server *v, worker_slot *ws, int with_optimizer, long step)
{
    const dt_optimizer *o = v->a->opt;
    pthread_mutex_lock(&v->mu);
    const float *params = v->params;
    int pushing = v->ps->fixed && slowest_clock(v) != LONG_MAX;
    if (pushing && with_optimizer)
        while (!v->failed && v->round <= step && slowest_clock(v) != LONG_MAX)
            pthread_cond_wait(&v->cv, &v->mu);
    else if (pushing)
        params = round_params(v, v->round);
    int rc = v->failed ? DT_ERR_ABORTED : dt_send(ws->link, params, v->n, DT_F32, 0);
    if (with_optimizer) {
        if (rc == 0 && o->m) rc = dt_send(ws->link, o->m, v->n, DT_F32, 0);
        if (rc == 0 && o->v) rc = dt_send(ws->link, o->v, v->n, DT_F32, 0);
        int64_t t = o->t;
        if (rc == 0) rc = dt_send(ws->link, &t, 1, DT_I64, 0);
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}

static void stopped(server *v, int w)
{
    pthread_mutex_lock(&v->mu);
    v->clock[w] = LONG_MAX; /* no longer holds the others back */
    if (v->ps->fixed) keep_rounds(v);
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
}

static void *serve_worker(void *arg)
{
    worker_slot *ws = arg;
    server *v = ws->srv;
    for (;;) {
        dt_ps_ctrl ctrl;
        int rc = dt_ps_recv_ctrl(ws->link, 0, &ctrl);
        if (rc == 0) {
            switch (ctrl.kind) {
            case DT_PS_DONE: stopped(v, ws->w); break;
            case DT_PS_STOP: stopped(v, ws->w); return NULL;
            case DT_PS_PULL: rc = send_state(v, ws, 0, ctrl.step); break;
            case DT_PS_FETCH: rc = send_state(v, ws, 1, ctrl.step); break;
            case DT_PS_STEP:
                rc = recv_push(v, ws);
                if (rc == 0)
                    rc = v->ps->async ? async_step(v, ws, ctrl.step) : sync_step(v, ws, ctrl.step);
                break;
            default: rc = DT_ERR_PROTOCOL; break;
            }
        }
        if (rc != 0) {
            ws->rc = rc;
            fail(v, rc == DT_ERR_PROTOCOL ? "unknown control message" : "serving a worker",
                 ws->link);
            stopped(v, ws->w);
            return NULL;
        }
    }
}

/* ---- setup --------------------------------------------------------------- */

/* Worker 0's INIT: the starting shard, and on resume the optimizer state. */
static int receive_init(server *v)
{
    dt_comm *link = v->ps->links[0];
    dt_ps_ctrl ctrl = {0};
    dt_optimizer *o = v->a->opt;
    int rc = dt_ps_recv_ctrl(link, 0, &ctrl);
    if (rc == 0 && ctrl.kind != DT_PS_INIT) rc = DT_ERR_PROTOCOL;
    if (rc == 0) rc = dt_recv(link, v->params, v->n, DT_F32, 0);
    if (ctrl.arg >= 0) {
        if (rc == 0 && o->m) rc = dt_recv(link, o->m, v->n, DT_F32, 0);
        if (rc == 0 && o->v) rc = dt_recv(link, o->v, v->n, DT_F32, 0);
        if (rc == 0) o->t = (long)ctrl.arg;
    }
    v->first = v->round = ctrl.step;
    for (int w = 0; w < v->ps->workers; w++) v->clock[w] = ctrl.step;
    if (rc == 0 && v->ps->fixed)
        memcpy(round_params(v, v->first), v->params, v->n * sizeof(float));
    if (rc != 0)
        dt_strf(v->err, sizeof v->err, "parameter server %d: receiving the starting state: %s",
                v->s, rc == DT_ERR_PROTOCOL ? "unexpected message" : dt_comm_error(link));
    return rc;
}

static int setup(server *v, const dt_ps_server_args *a)
{
    dt_ps *ps = a->ps;
    int W = ps->workers;
    v->a = a;
    v->ps = ps;
    v->s = ps->index;
    v->lo = ps->shard_lo[v->s];
    v->n = dt_ps_shard_len(ps, v->s);
    pthread_mutex_init(&v->mu, NULL);
    pthread_cond_init(&v->cv, NULL);
    v->mine = calloc((size_t)ps->npieces, sizeof *v->mine);
    v->in_off = calloc((size_t)ps->npieces + 1, sizeof *v->in_off);
    v->slots = calloc((size_t)W, sizeof *v->slots);
    v->clock = calloc((size_t)W, sizeof *v->clock);
    v->params = dt_alloc(v->n * sizeof(float), DT_MEM_PARAMS);
    if (!v->mine || !v->in_off || !v->slots || !v->clock || !v->params) return -1;
    for (int p = 0; p < ps->npieces; p++)
        if (ps->pieces[p].server == v->s) v->mine[v->nmine++] = p;
    for (int i = 0; i < v->nmine; i++) v->in_off[i + 1] = v->in_off[i] + piece_bytes(v, i);
    if (!ps->async && !(v->acc = dt_alloc(v->n * sizeof(float), DT_MEM_GRADS))) return -1;
    for (int w = 0; w < W; w++) {
        worker_slot *ws = &v->slots[w];
        *ws = (worker_slot){.srv = v, .w = w, .link = ps->links[w]};
        if (!(ws->inbox = dt_alloc(v->in_off[v->nmine], DT_MEM_COMM))) return -1;
        if (ps->async && (!(ws->dense = dt_alloc(v->n * sizeof(float), DT_MEM_GRADS)) ||
                          !(ws->snapshot = dt_alloc(v->n * sizeof(float), DT_MEM_COMM))))
            return -1;
    }
    return 0;
}

/* fixed: the ring of the last K + 1 steps' shards. */
static int alloc_rounds(server *v)
{
    if (!v->ps->fixed) return 0;
    size_t steps = (size_t)v->ps->staleness + 1, bytes = steps * v->n * sizeof(float);
    if ((v->rounds = dt_alloc(bytes, DT_MEM_PARAMS))) return 0;
    dt_strf(v->err, sizeof v->err,
            "parameter server %d: out of memory for the %zu copies of its shard (%.1f MiB) "
            "that --fixed-staleness keeps with --staleness %d; a lower --staleness needs "
            "fewer", v->s, steps, (double)bytes / 1048576.0, v->ps->staleness);
    return -1;
}

static void teardown(server *v)
{
    for (int w = 0; v->slots && w < v->ps->workers; w++) {
        dt_free(v->slots[w].inbox);
        dt_free(v->slots[w].dense);
        dt_free(v->slots[w].snapshot);
    }
    free(v->slots);
    free(v->mine);
    free(v->in_off);
    free(v->clock);
    dt_free(v->acc);
    dt_free(v->rounds);
    pthread_mutex_destroy(&v->mu);
    pthread_cond_destroy(&v->cv);
}

int dt_ps_server_run(const dt_ps_server_args *a, float **params_out, long *updates_out,
                     char *err, size_t errlen)
{
    server v;
    memset(&v, 0, sizeof v);
    *params_out = NULL;
    int rc = setup(&v, a);
    if (rc != 0) dt_strf(v.err, sizeof v.err, "parameter server: out of memory for its shard");
    if (rc == 0) rc = alloc_rounds(&v);
    if (rc == 0) rc = receive_init(&v);
    int W = a->ps->workers, started = 0;
    pthread_t *threads = rc == 0 ? calloc((size_t)W, sizeof *threads) : NULL;
    for (int w = 0; threads && w < W; w++, started++)
        if (pthread_create(&threads[w], NULL, serve_worker, &v.slots[w]) != 0) break;
    if (rc == 0 && started < W) {
        /* The threads that did start stop when their comms abort. */
        dt_strf(v.err, sizeof v.err, "parameter server: cannot start a thread per worker");
        rc = -1;
    }
    for (int w = 0; w < started; w++) pthread_join(threads[w], NULL);
    free(threads);
    if (rc == 0 && v.failed) rc = -1;
    if (rc != 0) dt_strf(err, errlen, "%s", v.err);
    *params_out = v.params;
    if (updates_out) *updates_out = v.updates;
    teardown(&v);
    return rc ? -1 : 0;
}
