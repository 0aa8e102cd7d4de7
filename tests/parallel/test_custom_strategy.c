/* Strategies the library does not have, plugged in from outside. This
 * program registers them, then trains through the library's own trainer
 * with whatever flags it is given, as `dtrain train` would:
 *
 *   dtrain launch -n 2 test_custom_strategy --strategy reduce_bcast ...
 *
 * - reduce_bcast: data parallelism whose gradients meet by an explicit
 *   reduce to rank 0 and a broadcast back, instead of DDP's all-reduce.
 *   Reducing in rank order and scaling by 1/N is DDP's arithmetic, so at 2
 *   ranks the weights are bit-identical to DDP's.
 * - reduce_bcast_audit: the same with a second layer on the stack that
 *   owns the running of the micro-batches (as a pipeline schedule would)
 *   and checks that every hook comes in order; two layers that know
 *   nothing of each other compose.
 * - dp_with_audit: naive DP and that layer, which both run the
 *   micro-batches: refused when the stack is built.
 * Nothing in the trainer knows these strategies exist
 * (test_custom_strategy.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "parallel/registry.h"
#include "train/config/config.h"
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
    if (dt_reduce(r->world, m->grads, m->grads, m->n_floats, DT_F32, DT_SUM, 0) ||
        dt_broadcast(r->world, m->grads, m->grads, m->n_floats, DT_F32, 0))
        return dt_strf(r->err, sizeof r->err, "reduce_bcast: %s", dt_comm_error(r->world)), -1;
    /* The mean, as DDP's average finishes it. */
    const float scale = 1.0f / (float)r->size;
    for (size_t i = 0; i < m->n_floats; i++) m->grads[i] *= scale;
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

static void rb_destroy(void *self) { free(self); }

static const dt_strategy_ops rb_ops = {
    .name = "reduce_bcast",
    .start = rb_start,
    .end_grads = rb_end_grads,
    .traffic = rb_traffic,
    .describe = rb_describe,
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
    return dt_strategy_add(S, &rb_ops, L);
}

static const dt_strategy_kind rb_kind = {"reduce_bcast", "reduce to rank 0, broadcast back",
                                         rb_size, rb_build, NULL};

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
    if (rc == 0) rc = dt_train(&c, err, sizeof err);
    if (rc != 0) fprintf(stderr, "test_custom_strategy: %s\n", err);
    return rc ? 1 : 0;
}
