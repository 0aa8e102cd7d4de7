/* Strategies the library does not have, plugged in from outside. This
 * program registers them, then trains through the library's own trainer
 * with whatever flags it is given, as `dtrain train` would:
 *
 *   dtrain launch -n 2 test_custom_strategy --strategy reduce_bcast ...
 *
 * - reduce_bcast: data parallelism whose gradients meet by an explicit
 *   reduce to rank 0 and a broadcast back, instead of DDP's all-reduce.
 *   As DDP does, it says how many ranks sum gradients (grad_ranks), so
 *   each rank weighs its tokens by 1 / (every rank's tokens) and the mean
 *   is formed before the sum; summing in rank order is then DDP's
 *   arithmetic, and at 2 ranks the weights are bit-identical to DDP's.
 * - reduce_bcast_audit: the same with a second layer on the stack that
 *   owns the running of the micro-batches (as a pipeline schedule would)
 *   and checks that every hook comes in order; two layers that know
 *   nothing of each other compose.
 * - dp_with_audit: naive DP and that layer, which both run the
 *   micro-batches: refused when the stack is built.
 * Nothing in the trainer knows these strategies exist
 * (test_custom_strategy.sh). reduce_bcast says what its ranks hold (the
 * kind's places hook, the layer's mem_plan): its whole flat buffer, so
 * `--dry-run` (run here as `dtrain train` runs it) and the run's memory
 * table print its figures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap/bootstrap.h"
#include "core/str.h"
#include "model/acts.h"
#include "parallel/registry.h"
#include "train/config/config.h"
#include "train/dry_run.h"
#include "train/trainer.h"

typedef struct {
    dt_strategy *S;
    uint64_t bytes;
} reduce_bcast;

static int rb_end_grads(void *self)
{
    reduce_bcast *L = self;
    dt_rank *r = L->S->rank;
    dt_gpt *m = r->model;
    uint64_t before = dt_comm_bytes_sent(r->world);
    /* Each rank's share is weighed already (grad_ranks): the sum is the mean. */
    if (dt_reduce(r->world, m->grads, m->grads, m->n_floats, DT_F32, DT_SUM, 0) ||
        dt_broadcast(r->world, m->grads, m->grads, m->n_floats, DT_F32, 0))
        return dt_strf(r->err, sizeof r->err, "reduce_bcast: %s", dt_comm_error(r->world)), -1;
    L->bytes = dt_comm_bytes_sent(r->world) - before;
    return 0;
}

static int rb_start(void *self, dt_rank *r)
{
    (void)self;
    if (dt_broadcast(r->world, r->model->params, r->model->params, r->model->n_floats, DT_F32, 0))
        return dt_strf(r->err, sizeof r->err, "reduce_bcast: %s", dt_comm_error(r->world)), -1;
    return 0;
}

static void rb_traffic(void *self, double *comm_ms, uint64_t *bytes)
{
    *comm_ms = 0;
    *bytes = ((reduce_bcast *)self)->bytes;
}

static void rb_describe(void *self, FILE *f)
{
    fprintf(f, " x %d ranks (reduce to rank 0, then broadcast)", ((reduce_bcast *)self)->S->rank->size);
}

/* What each rank holds: the model's whole flat buffer, padding included
 * (parameters, gradients, optimizer state over all of it), the largest
 * segment in use at once, one micro-batch's activations. No ZeRO: one
 * copy each. */
static dt_rank_mem rb_holds(const dt_gpt *m, int B, int T)
{
    dt_rank_mem h = {.floats = m->n_floats, .copies = 1,
                     .acts = 4.0 * (double)dt_gpt_acts_floats(m, B, T)};
    for (int s = 0; s <= m->cfg.n_layer + 1; s++) {
        size_t len = dt_gpt_segment_start(m, s + 1) - dt_gpt_segment_start(m, s);
        if (len > h.in_use) h.in_use = h.grads_open = len;
    }
    return h;
}

static int rb_mem_plan(void *self, int r, dt_rank_mem *out)
{
    dt_rank *rk = ((reduce_bcast *)self)->S->rank;
    (void)r;
    *out = rb_holds(rk->model, rk->B, rk->T);
    return 1;
}

static void rb_destroy(void *self) { free(self); }

static const dt_strategy_ops rb_ops = {
    .name = "reduce_bcast",
    .start = rb_start,
    .end_grads = rb_end_grads,
    .traffic = rb_traffic,
    .describe = rb_describe,
    .mem_plan = rb_mem_plan,
    .destroy = rb_destroy,
};

static int rb_size(const dt_parallel_opts *o, int world, int *dp, char *err, size_t n)
{
    (void)o, (void)err, (void)n;
    *dp = world;
    return 0;
}

static int rb_build(dt_strategy *S, const dt_parallel_opts *o)
{
    (void)o;
    dt_rank *r = S->rank;
    if (r->size < 2) return 0;
    reduce_bcast *L = calloc(1, sizeof *L);
    if (!L) return dt_strf(r->err, sizeof r->err, "out of memory"), -1;
    L->S = S;
    S->lockstep = r->world;
    S->dp_index = r->rank;
    S->dp_size = r->size;
    S->grad_ranks *= r->size; /* the ranks whose gradients its sum adds */
    return dt_strategy_add(S, &rb_ops, L);
}

/* One place: every rank holds the same. */
static int rb_places(const dt_places_job *j, dt_places *out, char *err, size_t n)
{
    if (dt_places_alloc(out, 1, err, n)) return -1;
    dt_strf(out->rows, sizeof out->rows, "reduce_bcast: every rank holds its whole flat buffer");
    dt_strf(out->at[0].label, sizeof out->at[0].label, "each of %d ranks", j->world);
    out->at[0].ranks = j->world;
    out->at[0].mem = rb_holds(j->layout, j->B, j->T);
    return 0;
}

static const dt_strategy_kind rb_kind = {"reduce_bcast", "reduce to rank 0, broadcast back",
                                         rb_size, rb_build, rb_places};

/* ---- a layer that runs the micro-batches and audits the hooks ---- */

typedef struct {
    dt_strategy *S;
    long steps, backwards, lasts, ends;
    int next_micro, out_of_order;
} audit;

static int au_begin_step(void *self, long step)
{
    audit *A = self;
    A->out_of_order += step != A->steps + A->S->rank->first_step || A->next_micro != 0;
    A->steps++;
    return 0;
}

/* It owns the micro-batches, as a pipeline schedule would, and here runs
 * them the default way. */
static int au_grads(void *self, uint64_t first, double *loss)
{
    return dt_step_local_grads(((audit *)self)->S, first, loss);
}

static void au_before_backward(void *self, int micro, int last)
{
    audit *A = self;
    A->out_of_order += micro != A->next_micro || last != (micro == A->S->rank->accum - 1);
    A->next_micro++;
    A->backwards++;
    A->lasts += last;
}

static int au_end_grads(void *self)
{
    audit *A = self;
    A->out_of_order += A->next_micro != A->S->rank->accum;
    A->next_micro = 0;
    A->ends++;
    return 0;
}

static int au_end(void *self)
{
    audit *A = self;
    if (A->S->rank->rank == 0)
        printf("audit: %ld steps, %ld backward passes (%ld last), %ld ends, %d out of order\n",
               A->steps, A->backwards, A->lasts, A->ends, A->out_of_order);
    return 0;
}

static const dt_strategy_ops audit_ops = {
    .name = "audit",
    .begin_step = au_begin_step,
    .grads = au_grads,
    .before_backward = au_before_backward,
    .end_grads = au_end_grads,
    .end = au_end,
    .destroy = rb_destroy,
};

static int add_audit(dt_strategy *S)
{
    audit *A = calloc(1, sizeof *A);
    if (!A) return dt_strf(S->rank->err, sizeof S->rank->err, "out of memory"), -1;
    A->S = S;
    return dt_strategy_add(S, &audit_ops, A);
}

static int rb_audit_build(dt_strategy *S, const dt_parallel_opts *o)
{
    return rb_build(S, o) || add_audit(S) ? -1 : 0;
}

static const dt_strategy_kind rb_audit_kind = {
    "reduce_bcast_audit", "reduce_bcast, with the micro-batches run by an auditing layer",
    rb_size, rb_audit_build, NULL};

static int dp2_size(const dt_parallel_opts *o, int world, int *dp, char *err, size_t n)
{
    (void)o, (void)world, (void)err, (void)n;
    *dp = 2;
    return 0;
}

static int dp_audit_build(dt_strategy *S, const dt_parallel_opts *o)
{
    (void)o;
    return dt_naive_dp_strategy(S, 2) || add_audit(S) ? -1 : 0;
}

static const dt_strategy_kind dp_audit_kind = {
    "dp_with_audit", "naive DP and the auditing layer: both run the micro-batches", dp2_size,
    dp_audit_build, NULL};

/* `--dry-run` as `dtrain train` runs it, over the launcher's ranks; rank 0
 * prints. */
static int dry_run(dt_train_config *c, char *err, size_t n)
{
    dt_bootstrap b;
    if (dt_bootstrap_from_env(&b, err, n) || dt_dry_run_check(c, b.size, err, n)) return -1;
    return dt_dry_run(c, b.size, b.rank == 0 ? stdout : NULL, err, n);
}

static int wants_dry_run(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--dry-run") == 0) return 1;
    return 0;
}

int main(int argc, char **argv)
{
    if (dt_strategy_register(&rb_kind) || dt_strategy_register(&rb_audit_kind) ||
        dt_strategy_register(&dp_audit_kind)) {
        fprintf(stderr, "FAIL: cannot register the test strategies\n");
        return 1;
    }
    dt_train_config c;
    char err[1024];
    dt_config_defaults(&c);
    int rc = dt_config_parse_args(&c, argc, argv, err, sizeof err);
    if (rc == 0) rc = wants_dry_run(argc, argv) ? dry_run(&c, err, sizeof err)
                                                : dt_train(&c, err, sizeof err);
    if (rc != 0) fprintf(stderr, "test_custom_strategy: %s\n", err);
    return rc ? 1 : 0;
}
