/* A job that may shrink (`dtrain launch --min-nproc`, docs/launch.md): the
 * data-parallel ranks it started with (DTRAIN_VIRTUAL_WORLD_SIZE), which
 * it keeps as blocks of each batch however many ranks are left
 * (parallel/strategy.h, dt_virtual_blocks); the layouts that can; the
 * word to the launcher that this rank joined the job (a restarted rank
 * that fails before it is how the launcher knows that the rank cannot be
 * started); and rank 0's line on how a job that shrank keeps its batch. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/bootstrap/bootstrap.h"
#include "core/env.h"
#include "core/str.h"
#include "parallel/registry.h"
#include "train/run.h"
#include "train/trainer.h"

int dt_config_check_shrink(const dt_train_config *c, char *err, size_t n)
{
    char what[128];
    const dt_parallel_opts o = dt_config_parallel_opts(c);
    if (strcmp(c->strategy, "ddp")) dt_strf(what, sizeof what, "--strategy %s", c->strategy);
    else if (c->tp > 1) dt_strf(what, sizeof what, "--tp %d", c->tp);
    else if (c->cp > 1) dt_strf(what, sizeof what, "--cp %d", c->cp);
    else if (c->pp > 1) dt_strf(what, sizeof what, "--pp %d", c->pp);
    else if (c->num_experts > 0) dt_strf(what, sizeof what, "--num-experts %d", c->num_experts);
    else if (c->zero_stage > 2) dt_strf(what, sizeof what, "--zero-stage %d", c->zero_stage);
    else if (!strcmp(c->grad_accum_dtype, "bf16")) dt_strf(what, sizeof what,
                                                           "--grad-accum-dtype bf16");
    else if (o.grad_wire != DT_F32)
        dt_strf(what, sizeof what, "gradients reduced in bf16 (--comm-dtype %s, --dtype %s)",
                c->comm_dtype, c->dtype);
    else return 0;
    /* In bf16 a rank's sum of two blocks would round where two ranks'
     * gradients each rounded: not the bits of the job that did not shrink. */
    return dt_strf(err, n, "--min-nproc: a job that may shrink keeps its data-parallel blocks "
                   "over fewer ranks, which works for pure data parallelism: --strategy ddp "
                   "with --zero-stage 0, 1 or 2, a dense model, gradients accumulated and "
                   "reduced in fp32 (with --dtype bf16, --comm-dtype fp32); this run has %s",
                   what), -1;
}

int dt_run_virtual_env(dt_run *t, char *err, size_t n)
{
    long v = 0;
    if (dt_env_long("DTRAIN_VIRTUAL_WORLD_SIZE", 1, DT_MAX_WORLD_SIZE, &v, err, n) < 0) return -1;
    t->r.vsize = (int)v;
    return v > 0 ? dt_config_check_shrink(t->cfg, err, n) : 0;
}

int dt_run_virtual_joined(dt_run *t, char *err, size_t n)
{
    if (t->r.vsize > 0 && t->r.vsize < t->r.size)
        return dt_strf(err, n, "DTRAIN_VIRTUAL_WORLD_SIZE is %d, below the job's %d ranks: it "
                       "is the ranks the job started with (dtrain launch --min-nproc sets it)",
                       t->r.vsize, t->r.size), -1;
    long fd = -1;
    if (dt_env_long("DTRAIN_LAUNCH_JOINED_FD", 0, 1 << 20, &fd, err, n) < 0) return -1;
    if (fd < 0) return 0;
    /* The launcher counts a restarted rank that ends before this byte as
     * one that cannot be started; a failed write only costs it that. */
    ssize_t w;
    do w = write((int)fd, "j", 1);
    while (w < 0 && errno == EINTR);
    close((int)fd);
    unsetenv("DTRAIN_LAUNCH_JOINED_FD");
    return 0;
}

/* The algorithm forced for a collective (--comm-algo, else its
 * DTRAIN_<COLLECTIVE>_ALGO variable), or "auto". */
typedef struct {
    const char *coll;
    char algo[32];
} forced_algo;

static int note_forced(void *ctx, const char *coll, const char *algo, char *err, size_t n)
{
    (void)err, (void)n;
    forced_algo *f = ctx;
    if (!strcmp(coll, f->coll)) dt_strf(f->algo, sizeof f->algo, "%s", algo);
    return 0;
}

static void forced(const dt_train_config *c, const char *coll, const char *var, forced_algo *f)
{
    char e[64];
    const char *env = dt_env_str(var);
    f->coll = coll;
    dt_strf(f->algo, sizeof f->algo, "%s", env ? env : "auto");
    dt_config_each_comm_algo(c->comm_algo, note_forced, f, e, sizeof e);
}

/* Whether the gradients' sum is a left fold in rank order, which the
 * blocks kept over fewer ranks reproduce bit for bit: the naive and
 * parameter-server all-reduces (DDP), the direct reduce-scatter (ZeRO). */
static int rank_order(const dt_run *t, forced_algo *f)
{
    if (t->cfg->zero_stage > 0) {
        forced(t->cfg, "reduce_scatter", "DTRAIN_REDUCE_SCATTER_ALGO", f);
        return !strcmp(f->algo, "direct");
    }
    forced(t->cfg, "allreduce", "DTRAIN_ALLREDUCE_ALGO", f);
    return !strcmp(f->algo, "naive") || !strcmp(f->algo, "ps");
}

void dt_run_print_shrink(dt_run *t)
{
    const int v = t->r.vsize, p = t->r.size;
    if (v <= p || t->r.rank != 0) return;
    forced_algo f;
    const int ordered = rank_order(t, &f);
    fprintf(t->out, "shrunk: the %d of the job's %d ranks left keep its %d data-parallel "
            "blocks of each batch (%ld sequences a step, as before): ", p, v, v,
            t->global_batch);
    if (p > 1)
        fprintf(t->out, "rank 0 computes blocks 0-%d, %d times the others' work, rank r > 0 "
                "block r + %d", v - p, v - p + 1, v - p);
    else
        fprintf(t->out, "rank 0 computes all %d", v);
    if (ordered)
        fprintf(t->out, "; %s=%s sums in rank order, so the weights are the %d-rank run's "
                "bits\n", f.coll, f.algo, v);
    else if (v == 2)
        fprintf(t->out, "; two blocks sum to the same bits in either order, so the weights are "
                "the 2-rank run's bits\n");
    else
        fprintf(t->out, "; %s=%s does not sum in rank order, so the weights are within "
                "rounding of the %d-rank run's (--comm-algo %s=%s gives its bits)\n", f.coll,
                f.algo, v, f.coll, t->cfg->zero_stage > 0 ? "direct" : "naive");
    fflush(t->out);
}
