/* The tp x cp x dp x pp grid and the layers that run on it. See mesh.h. */
#include "parallel/mesh.h"

#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "parallel/context/cp.h"
#include "parallel/expert/ep.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/tensor/tp.h"

typedef struct {
    dt_mesh g;
    dt_strategy *S;
    int owns_replicas; /* no data-parallel layer took them */
    char (*hosts)[DT_MESH_HOST_NAME]; /* [world] each rank's host name, for the banner */
} mesh_layer;

int dt_mesh_replica_index(const dt_mesh *g) { return g->cp_i + g->cp * (g->dp_i / g->ep); }

void dt_mesh_coords(const dt_mesh *g, int r, int at[4])
{
    at[0] = r % g->tp;
    at[1] = r / g->tp % g->cp;
    at[2] = r / (g->tp * g->cp) % g->dp;
    at[3] = r / (g->tp * g->cp * g->dp);
}

/* "--tp 2 --pp 2": the sizes that split the model or the sequence. */
static const char *what_splits(const dt_parallel_opts *o, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    const char *name[] = {"--tp", "--cp", "--pp"};
    const int size[] = {o->tp, o->cp, o->pp};
    for (int i = 0; i < 3 && k < n; i++)
        if (size[i] > 1) k += (size_t)snprintf(buf + k, n - k, "%s%s %d", k ? " " : "", name[i],
                                               size[i]);
    return buf;
}

static int check_sizes(const dt_parallel_opts *o, int world, char *err, size_t errlen)
{
    char who[64];
    const int k = o->tp * o->cp * o->pp;
    if (o->dp > 0 && o->dp * k != world)
        return dt_strf(err, errlen, "--dp %d with %s makes %d ranks (tp x cp x dp x pp); this "
                       "job has %d: start --nproc %d, or leave --dp out to take the ranks / %d",
                       o->dp, what_splits(o, who, sizeof who), o->dp * k, world, o->dp * k,
                       k), -1;
    if (world % k == 0 && o->ep > 1 && (world / k) % o->ep)
        return dt_strf(err, errlen, "--expert-model-parallel-size %d takes its ranks from the "
                       "%d data-parallel ones, which it does not divide: start --nproc %d, or "
                       "choose an ep that divides %d", o->ep, world / k, world / k < o->ep
                       ? o->ep * k : (world / k / o->ep + 1) * o->ep * k, world / k), -1;
    if (world % k == 0) return 0;
    char ok[64];
    if (world < k) snprintf(ok, sizeof ok, "%d", k);
    else snprintf(ok, sizeof ok, "%d or %d", world / k * k, (world / k + 1) * k);
    return dt_strf(err, errlen, "%s needs a rank count that %d divides (ranks = tp x cp x "
                   "data-parallel x pp); this job has %d: start --nproc %s",
                   what_splits(o, who, sizeof who), k, world, ok), -1;
}

int dt_mesh_check(const dt_parallel_opts *o, int world, int *dp, char *err, size_t errlen)
{
    if (check_sizes(o, world, err, errlen)) return -1;
    if (o->pp > 1) {
        int per_stage;
        if (dt_pp_check(o, world, o->accum, &per_stage, err, errlen)) return -1;
        if ((o->tp > 1 || o->cp > 1) && o->pp_partition && !strcmp(o->pp_partition, "cost"))
            return dt_strf(err, errlen, "--pp-partition cost with --tp or --cp: the layers are "
                           "timed on one rank alone, and a split layer's forward needs its "
                           "whole group; use --pp-partition uniform or params"), -1;
    }
    *dp = world / (o->tp * o->cp * o->pp);
    return 0;
}

static int split(dt_comm *world, int color, int key, int size, dt_comm **out)
{
    dt_comm *c = NULL;
    if (dt_comm_split(world, color, key, &c)) return -1;
    if (size > 1) *out = c;
    else if (c) dt_comm_destroy(c);
    return 0;
}

/* Every rank takes part in every split, so the calls match across the job. */
static int form_groups(dt_mesh *g, dt_comm *world, char *err, size_t n)
{
    const int r = dt_comm_rank(world), tp = g->tp, inner = g->tp * g->cp * g->dp;
    int at[4];
    dt_mesh_coords(g, r, at);
    g->tp_i = at[0], g->cp_i = at[1], g->dp_i = at[2], g->pp_i = at[3];
    const int rep = dt_mesh_replica_index(g), end = g->pp_i == 0 || g->pp_i == g->pp - 1;
    const int ep = g->ep, edp = g->dp / ep, edp_i = g->dp_i / ep;
    g->ep_i = g->dp_i % ep;
    if (split(world, g->tp_i + tp * (g->cp_i + g->cp * (edp_i + edp * g->pp_i)), g->ep_i, ep,
              &g->ep_group) ||
        split(world, g->tp_i + tp * (g->cp_i + g->cp * (g->ep_i + ep * g->pp_i)), edp_i, edp,
              &g->edp_group) ||
        split(world, r / tp, g->tp_i, tp, &g->tp_group) ||
        split(world, g->tp_i + tp * (g->dp_i + g->dp * g->pp_i), g->cp_i, g->cp, &g->cp_group) ||
        split(world, g->tp_i + tp * (g->cp_i + g->cp * g->pp_i), g->dp_i, g->dp, &g->dp_group) ||
        split(world, r % inner, g->pp_i, g->pp, &g->pp_group) ||
        split(world, g->tp_i + tp * (g->ep_i + ep * g->pp_i), rep, g->cp * edp, &g->replicas) ||
        split(world, g->pp > 1 && end ? r % inner : DT_UNDEFINED, g->pp_i, 2, &g->tied) ||
        split(world, rep == 0 ? 0 : DT_UNDEFINED, r, tp * ep * g->pp, &g->writers) ||
        split(world, ep > 1 && rep == 0 && g->pp_i == 0 ? 0 : DT_UNDEFINED,
              g->tp_i + tp * g->ep_i, tp * ep, &g->slices))
        return dt_strf(err, n, "forming the mesh's groups: %s", dt_comm_error(world)), -1;
    return 0;
}

/* Each rank's host name, for the banner (collective). */
static int gather_hosts(mesh_layer *M, dt_comm *world, char *err, size_t n)
{
    int size = dt_comm_size(world);
    char me[DT_MESH_HOST_NAME] = {0};
    dt_strf(me, sizeof me, "%s", dt_comm_hostname(world));
    if (!(M->hosts = calloc((size_t)size, sizeof *M->hosts)))
        return dt_strf(err, n, "mesh: out of memory"), -1;
    if (dt_allgather(world, me, M->hosts, DT_MESH_HOST_NAME, DT_U8))
        return dt_strf(err, n, "mesh: the ranks' hosts: %s", dt_comm_error(world)), -1;
    return 0;
}

/* Planning last: who writes a checkpoint's shards. A ZeRO layer decided
 * already where it split the state (every rank writes its pieces); else
 * replica 0 writes what the layers above left it to own (a stage's
 * ranges, a tensor-parallel rank's slices), all such ranks together. */
static int mesh_plan(void *self, dt_rank *r, dt_gpt *layout, dt_share *share)
{
    mesh_layer *M = self;
    dt_strategy *S = M->S;
    (void)r, (void)layout, (void)share;
    if (S->shard || !S->owned || dt_mesh_replica_index(&M->g) != 0) return 0;
    S->saves = S->owned;
    S->save_group = M->g.writers;
    return 0;
}

/* The blocks of the batch evaluate different batches; the rest of a block
 * (its slices, its rows, its stages) evaluates the same ones with it. */
static int mesh_eval_group(void *self, int final, dt_comm **group)
{
    mesh_layer *M = self;
    (void)final;
    *group = M->g.dp_group;
    return 1;
}

static void mesh_destroy(void *self)
{
    mesh_layer *M = self;
    dt_comm *own[] = {M->g.tp_group, M->g.cp_group, M->g.dp_group, M->g.pp_group, M->g.tied,
                      M->g.writers, M->g.ep_group, M->g.edp_group, M->g.slices,
                      M->owns_replicas ? M->g.replicas : NULL};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (own[i]) dt_comm_destroy(own[i]);
    free(M->hosts);
    free(M);
}

static void mesh_describe(void *self, FILE *f)
{
    mesh_layer *M = self;
    dt_mesh_print(&M->g, M->hosts[0], f);
}

static const dt_strategy_ops mesh_ops = {
    .name = "mesh",
    .plan = mesh_plan,
    .eval_group = mesh_eval_group,
    .describe_lines = mesh_describe,
    .destroy = mesh_destroy,
};

/* DDP or ZeRO over the replicas (it owns their group from here on), then
 * the layers that split the model, bottom to top. The trainer's teardown
 * destroys what was added when one fails. */
static int add_layers(dt_strategy *S, mesh_layer *M, const dt_parallel_opts *o)
{
    dt_mesh *g = &M->g;
    if (g->replicas) {
        M->owns_replicas = 0;
        if (dt_data_parallel_on(S, g->replicas, o)) return -1;
    }
    if (g->cp > 1 && dt_cp_layer(S, g, o)) return -1;
    if (g->pp > 1 && dt_pp_layer(S, g, o)) return -1;
    if (g->ep > 1 && dt_ep_layer(S, g)) return -1;
    if (g->tp > 1 && dt_tp_layer(S, g, o->sp)) return -1;
    return 0;
}

int dt_mesh_strategy(dt_strategy *S, const dt_parallel_opts *o)
{
    dt_rank *r = S->rank;
    int dp;
    if (dt_mesh_check(o, r->size, &dp, r->err, sizeof r->err)) return -1;
    mesh_layer *M = calloc(1, sizeof *M);
    if (!M) return dt_strf(r->err, sizeof r->err, "mesh: out of memory"), -1;
    M->S = S;
    M->owns_replicas = 1;
    M->g = (dt_mesh){.tp = o->tp, .cp = o->cp, .dp = dp, .pp = o->pp,
                     .ep = o->ep > 1 ? o->ep : 1};
    if (form_groups(&M->g, r->world, r->err, sizeof r->err) ||
        gather_hosts(M, r->world, r->err, sizeof r->err))
        return mesh_destroy(M), -1;
    if (dt_strategy_add(S, &mesh_ops, M) || add_layers(S, M, o)) return -1;
    S->lockstep = r->world;
    S->writes_checkpoints = r->rank == 0;
    S->dp_index = M->g.dp_i;
    S->dp_size = dp;
    S->block_ranks = o->tp * o->cp * o->pp;
    return 0;
}
