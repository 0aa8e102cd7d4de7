/* The parameter server as two strategy layers: a worker trains and leaves
 * the update to the servers; a server serves instead of training. Both
 * join the same split of the job (ps.h). See registry.h. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/str.h"
#include "parallel/ps_server.h"
#include "parallel/ps_worker.h"
#include "parallel/registry.h"

typedef struct {
    dt_ps ps;
    dt_ps_worker w; /* worker */
    float *shard;   /* server: its parameters after serving */
    dt_strategy *S;
    dt_parallel_opts o;
} ps_layer;

static int failed_on(ps_layer *L, dt_comm *c, const char *what)
{
    dt_rank *r = L->S->rank;
    return dt_strf(r->err, sizeof r->err, "%s: %s", what, dt_comm_error(c)), -1;
}

/* Collective over the job: the roles, the shards, the links. */
static int join(ps_layer *L, dt_rank *r, const dt_gpt *layout)
{
    dt_compress_spec spec;
    if (dt_compress_parse(L->o.compress, &spec, r->err, sizeof r->err)) return -1;
    dt_ps_mode mode = {L->o.ps_async, L->o.staleness, L->o.fixed_staleness};
    return dt_ps_join(&L->ps, r->world, L->o.servers, layout, &spec, &mode, r->err,
                      sizeof r->err);
}

static int replicas(void *self, uint64_t *hash)
{
    ps_layer *L = self;
    dt_rank *r = L->S->rank;
    const float *p = L->ps.is_server ? L->shard : r->model->params;
    int same = dt_ps_params_identical(&L->ps, r->world, p, hash);
    return same < 0 ? failed_on(L, r->world, "comparing replicas") : same;
}

static void rank_label(void *self, int r, char *buf, size_t n)
{
    if (r >= ((ps_layer *)self)->ps.workers) dt_strf(buf, n, "server");
}

static void destroy(void *self)
{
    ps_layer *L = self;
    dt_ps_worker_free(&L->w);
    dt_ps_leave(&L->ps);
    dt_free(L->shard);
    free(L);
}

/* ---- worker ----------------------------------------------------------------- */

/* Rank 0 keeps an optimizer to stage checkpoints; on resume every worker
 * loads one, rank 0 hands it to the servers, and the others drop it. */
static int stages_checkpoints(const dt_rank *r) { return r->rank == 0 && r->saves; }

static int worker_plan(void *self, dt_rank *r, dt_gpt *layout, dt_share *share)
{
    ps_layer *L = self;
    if (join(L, r, layout)) return -1;
    int with_opt = stages_checkpoints(r) || r->resuming;
    *share = (dt_share){.model = 1, .opt_lo = 0, .opt_hi = with_opt ? layout->n_floats : 0};
    dt_strategy *S = L->S;
    S->lockstep = L->ps.async ? NULL : L->ps.role;
    S->refreshes_params = 1; /* each step's pull */
    S->dp_index = L->ps.index;
    S->dp_size = L->ps.workers;
    if (r->rank == 0 && L->ps.compress.kind == DT_COMPRESS_TOPK && L->o.optimizer &&
        strcmp(L->o.optimizer, "sgd"))
        DT_WARN("--compress %s with %s: error feedback delivers each coordinate as a rare "
                "spike, which Adam normalises into a full-size step whatever its signal; "
                "top-k suits sgd (see docs/train.md)", L->o.compress, L->o.optimizer);
    return 0;
}

/* Rank 0 hands the servers the starting state; every worker then starts
 * from the servers' parameters. */
static int worker_start(void *self, dt_rank *r)
{
    ps_layer *L = self;
    if (dt_ps_worker_init(&L->w, &L->ps, r->model, r->err, sizeof r->err)) return -1;
    L->w.step = r->first_step;
    if (r->rank == 0 &&
        dt_ps_worker_init_servers(&L->w, r->resuming ? r->opt : NULL, r->first_step))
        return failed_on(L, L->w.link, "handing the servers their shards");
    if (dt_ps_worker_pull(&L->w)) return failed_on(L, L->w.link, "the first pull");
    if (!stages_checkpoints(r)) dt_optimizer_free(r->opt);
    return 0;
}

static int worker_begin_step(void *self, long step)
{
    ps_layer *L = self;
    return dt_ps_worker_begin_step(&L->w, step) ? failed_on(L, L->w.link, "parameter server step")
                                                : 0;
}

static void worker_before_backward(void *self, int micro, int last)
{
    (void)micro;
    dt_ps_worker_begin_backward(&((ps_layer *)self)->w, last);
}

static int worker_end_grads(void *self)
{
    ps_layer *L = self;
    return dt_ps_worker_finish(&L->w)
               ? failed_on(L, L->w.link, "parameter server push and pull")
               : 0;
}

/* The servers clipped with the norm they computed, and updated. */
static int worker_norm(void *self, double *norm)
{
    *norm = ((ps_layer *)self)->w.norm;
    return 0;
}

static int worker_update(void *self, double lr, float coef)
{
    (void)self, (void)lr, (void)coef;
    return 0;
}

static void worker_traffic(void *self, double *comm_ms, uint64_t *bytes)
{
    ps_layer *L = self;
    *comm_ms = L->w.wait_ms;
    *bytes = L->w.bytes_sent;
}

/* Asynchronous workers hold different parameters while they train, so
 * rank 0 evaluates its own alone; at the end they all hold the same. */
static int worker_eval_group(void *self, int final, dt_comm **group)
{
    ps_layer *L = self;
    *group = L->ps.role;
    if (!L->ps.async || final) return 1;
    *group = NULL;
    return L->S->rank->rank == 0;
}

/* The optimizer state lives on the servers: the writer gathers it. */
static int worker_before_save(void *self)
{
    ps_layer *L = self;
    if (!L->S->writes_checkpoints) return 0;
    return dt_ps_worker_fetch(&L->w, L->S->rank->opt)
               ? failed_on(L, L->w.link, "fetching the servers' state for a checkpoint")
               : 0;
}

/* Asynchronous workers end at different moments and with different
 * parameters: they wait for each other, then all take the servers' last.
 * One that stops early (a signal) first tells the servers, so that the
 * others' steps no longer wait for its pushes. */
static int worker_end(void *self)
{
    ps_layer *L = self;
    if (dt_ps_worker_done(&L->w)) return failed_on(L, L->w.link, "telling the servers it is done");
    if (dt_barrier(L->ps.role)) return failed_on(L, L->ps.role, "waiting for the other workers");
    if (dt_ps_worker_pull(&L->w)) return failed_on(L, L->w.link, "pulling the final parameters");
    return 0;
}

static int worker_release(void *self)
{
    ps_layer *L = self;
    return dt_ps_worker_stop(&L->w) ? failed_on(L, L->w.link, "stopping the servers") : 0;
}

static void worker_describe(void *self, FILE *f)
{
    ps_layer *L = self;
    const dt_ps *ps = &L->ps;
    fprintf(f, " x %d workers (parameter server over %s: %d server%s, %s", ps->workers,
            dt_comm_transport(L->S->rank->world), ps->servers, ps->servers > 1 ? "s" : "",
            ps->async ? "async" : "sync");
    if (ps->async) fprintf(f, " with staleness %d%s", ps->staleness, ps->fixed ? " fixed" : "");
    fprintf(f, ", %d pieces per push, compression %s)", ps->npieces, L->o.compress);
}

static const dt_strategy_ops worker_ops = {
    .name = "ps-worker",
    .plan = worker_plan,
    .start = worker_start,
    .begin_step = worker_begin_step,
    .before_backward = worker_before_backward,
    .end_grads = worker_end_grads,
    .grad_norm = worker_norm,
    .update = worker_update,
    .traffic = worker_traffic,
    .eval_group = worker_eval_group,
    .before_save = worker_before_save,
    .end = worker_end,
    .release = worker_release,
    .replicas_identical = replicas,
    .describe = worker_describe,
    .rank_label = rank_label,
    .destroy = destroy,
};

/* ---- server ----------------------------------------------------------------- */

/* A server holds the layout and its shard's optimizer state, which rank 0
 * fills at start. */
static int server_plan(void *self, dt_rank *r, dt_gpt *layout, dt_share *share)
{
    ps_layer *L = self;
    if (join(L, r, layout)) return -1;
    int s = L->ps.index;
    *share = (dt_share){.model = 0, .opt_lo = L->ps.shard_lo[s], .opt_hi = L->ps.shard_lo[s + 1]};
    return 0;
}

static int server_serve(void *self)
{
    ps_layer *L = self;
    dt_rank *r = L->S->rank;
    dt_ps_server_args a = {.ps = &L->ps, .layout = r->model, .opt = r->opt, .lr_at = r->lr_at,
                           .lr_ctx = r->lr_ctx, .grad_clip = r->grad_clip};
    long updates = 0;
    return dt_ps_server_run(&a, &L->shard, &updates, r->err, sizeof r->err);
}

static const dt_strategy_ops server_ops = {
    .name = "ps-server",
    .plan = server_plan,
    .serve = server_serve,
    .replicas_identical = replicas,
    .rank_label = rank_label,
    .destroy = destroy,
};

/* The last o->servers ranks serve, the others work. */
int dt_ps_strategy(dt_strategy *S, const dt_parallel_opts *o)
{
    dt_rank *r = S->rank;
    ps_layer *L = calloc(1, sizeof *L);
    if (!L) return dt_strf(r->err, sizeof r->err, "parameter server: out of memory"), -1;
    L->S = S;
    L->o = *o;
    int server = r->rank >= r->size - o->servers;
    if (server) S->writes_checkpoints = 0;
    return dt_strategy_add(S, server ? &server_ops : &worker_ops, L);
}
