/* A strategy the library does not have, plugged in from outside: data
 * parallelism whose gradients meet by an explicit reduce to rank 0 and a
 * broadcast back, instead of DDP's all-reduce. This program registers it,
 * then trains through the library's own trainer with `--strategy
 * reduce_bcast` and whatever flags it is given, as `dtrain train` would:
 *
 *   dtrain launch -n 2 test_custom_strategy --data X ... --save-final W
 *
 * test_custom_strategy.sh compares its weights with DDP's: reducing in
 * rank order and scaling by 1/N is DDP's arithmetic, so at 2 ranks they are
 * bit-identical. Nothing in the trainer knows this strategy exists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "parallel/registry.h"
#include "train/config.h"
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
                                         rb_size, rb_build};

int main(int argc, char **argv)
{
    if (dt_strategy_register(&rb_kind)) {
        fprintf(stderr, "FAIL: cannot register reduce_bcast\n");
        return 1;
    }
    dt_train_config c;
    char err[1024];
    dt_config_defaults(&c);
    int rc = dt_config_parse_args(&c, argc, argv, err, sizeof err);
    if (rc == 0 && strcmp(c.strategy, "reduce_bcast") != 0) {
        fprintf(stderr, "FAIL: give --strategy reduce_bcast (got %s)\n", c.strategy);
        return 1;
    }
    if (rc == 0) rc = dt_train(&c, err, sizeof err);
    if (rc != 0) fprintf(stderr, "test_custom_strategy: %s\n", err);
    return rc ? 1 : 0;
}
