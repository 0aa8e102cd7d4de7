/* The tp x cp x dp grid and the layers that run on it. See mesh.h. */
#include "parallel/mesh.h"

#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "parallel/context/cp.h"
#include "parallel/tensor/tp.h"

typedef struct {
    dt_mesh g;
    int owns_replicas; /* no data-parallel layer took them */
} mesh_layer;

int dt_mesh_replica_index(const dt_mesh *g) { return g->cp_i + g->cp * g->dp_i; }

static const char *what_splits(const dt_parallel_opts *o, char *buf, size_t n)
{
    if (o->tp > 1 && o->cp > 1) snprintf(buf, n, "--tp %d --cp %d", o->tp, o->cp);
    else if (o->tp > 1) snprintf(buf, n, "--tp %d", o->tp);
    else snprintf(buf, n, "--cp %d", o->cp);
    return buf;
}

int dt_mesh_check(const dt_parallel_opts *o, int world, int *dp, char *err, size_t errlen)
{
    char who[48];
    const int k = o->tp * o->cp;
    what_splits(o, who, sizeof who);
    if (world % k) {
        char ok[64];
        if (world < k) snprintf(ok, sizeof ok, "%d", k);
        else snprintf(ok, sizeof ok, "%d or %d", world / k * k, (world / k + 1) * k);
        return dt_strf(err, errlen, "%s needs a rank count that %d divides (ranks = %s"
                       "data-parallel); this job has %d: start --nproc %s", who, k,
                       o->tp > 1 && o->cp > 1 ? "tp x cp x " : o->tp > 1 ? "tp x " : "cp x ",
                       world, ok), -1;
    }
    if (o->pp > 1)
        return dt_strf(err, errlen, "%s with --pp %d: pipeline parallelism together with tensor "
                       "or context parallelism is not built yet; use one of them", who,
                       o->pp), -1;
    if (o->zero.stage > 1)
        return dt_strf(err, errlen, "%s with --zero-stage %d: ZeRO shards the state of tensor "
                       "or context parallelism only at stage 1 for now; use --zero-stage 1, "
                       "or 0", who, o->zero.stage), -1;
    *dp = world / k;
    return 0;
}

static int split(dt_comm *world, int color, int key, int size, dt_comm **out)
{
    dt_comm *c = NULL;
    if (dt_comm_split(world, color, key, &c)) return -1;
    if (size > 1) *out = c;
    else dt_comm_destroy(c);
    return 0;
}

/* Every rank takes part in every split, so the calls match across the job. */
static int form_groups(dt_mesh *g, dt_comm *world, char *err, size_t n)
{
    const int r = dt_comm_rank(world);
    g->tp_i = r % g->tp;
    g->cp_i = r / g->tp % g->cp;
    g->dp_i = r / (g->tp * g->cp);
    if (split(world, g->cp_i + g->cp * g->dp_i, g->tp_i, g->tp, &g->tp_group) ||
        split(world, g->tp_i + g->tp * g->dp_i, g->cp_i, g->cp, &g->cp_group) ||
        split(world, g->tp_i + g->tp * g->cp_i, g->dp_i, g->dp, &g->dp_group) ||
        split(world, g->tp_i, dt_mesh_replica_index(g), g->cp * g->dp, &g->replicas))
        return dt_strf(err, n, "forming the tp x cp x dp groups: %s", dt_comm_error(world)), -1;
    return 0;
}

/* The blocks of the batch evaluate different batches; the rest of a block
 * (its slices, its rows) evaluates the same ones with it. */
static int mesh_eval_group(void *self, int final, dt_comm **group)
{
    mesh_layer *M = self;
    (void)final;
    *group = M->g.dp_group;
    return 1;
}

static void mesh_describe(void *self, FILE *f)
{
    mesh_layer *M = self;
    fprintf(f, "\n  mesh: tp %d x cp %d x dp %d, this rank (tp %d, cp %d, dp %d)", M->g.tp,
            M->g.cp, M->g.dp, M->g.tp_i, M->g.cp_i, M->g.dp_i);
}

static void mesh_destroy(void *self)
{
    mesh_layer *M = self;
    dt_comm *own[] = {M->g.tp_group, M->g.cp_group, M->g.dp_group,
                      M->owns_replicas ? M->g.replicas : NULL};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (own[i]) dt_comm_destroy(own[i]);
    free(M);
}

static const dt_strategy_ops mesh_ops = {
    .name = "mesh",
    .eval_group = mesh_eval_group,
    .describe = mesh_describe,
    .destroy = mesh_destroy,
};

int dt_mesh_strategy(dt_strategy *S, const dt_parallel_opts *o)
{
    dt_rank *r = S->rank;
    int dp;
    if (dt_mesh_check(o, r->size, &dp, r->err, sizeof r->err)) return -1;
    mesh_layer *M = calloc(1, sizeof *M);
    if (!M) return dt_strf(r->err, sizeof r->err, "mesh: out of memory"), -1;
    M->g = (dt_mesh){.tp = o->tp, .cp = o->cp, .dp = dp};
    if (form_groups(&M->g, r->world, r->err, sizeof r->err)) return mesh_destroy(M), -1;
    /* DDP or ZeRO-1 over the ranks that hold the same parameters; it owns
     * their group from here on. */
    if (M->g.replicas && dt_data_parallel_on(S, M->g.replicas, o)) {
        M->g.replicas = NULL;
        return mesh_destroy(M), -1;
    }
    if ((M->g.cp > 1 && dt_cp_layer(S, &M->g, o)) || (M->g.tp > 1 && dt_tp_layer(S, &M->g, o->sp)))
        return mesh_destroy(M), -1;
    S->lockstep = r->world;
    S->writes_checkpoints = r->rank == 0;
    S->dp_index = M->g.dp_i;
    S->dp_size = dp;
    S->block_ranks = o->tp * o->cp;
    if (dt_strategy_add(S, &mesh_ops, M)) return mesh_destroy(M), -1;
    return 0;
}
