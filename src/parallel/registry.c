/* The table of strategy kinds. See registry.h. */
#include "parallel/registry.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/str.h"
#include "parallel/mesh.h"

/* A job that splits the model or the sequence runs on the mesh. */
static int on_mesh(const dt_parallel_opts *o)
{
    return o->tp > 1 || o->cp > 1 || o->pp > 1 || o->ep > 1;
}

static int ddp_size(const dt_parallel_opts *o, int world, int *dp, char *err, size_t n)
{
    if (on_mesh(o)) return dt_mesh_check(o, world, dp, err, n);
    if (o->dp > 0 && o->dp != world)
        return dt_strf(err, n, "--dp %d, but this job has %d ranks (with no --tp, --cp or "
                       "--pp every rank is data-parallel): start --nproc %d, or leave --dp "
                       "out", o->dp, world, o->dp), -1;
    *dp = world;
    return 0;
}

static int ddp_build(dt_strategy *S, const dt_parallel_opts *o)
{
    if (on_mesh(o)) return dt_mesh_strategy(S, o); /* DDP or ZeRO over the replicas, if any */
    /* One process shares nothing, unless it is what is left of a job that
     * shrank: it computes every block, and the layer reduces them as the
     * job did (dt_strategy_dp_blocks). */
    if (S->rank->size == 1 && S->rank->vsize <= 1) return 0;
    if (o->zero.stage == 0) return dt_ddp_strategy(S, o->bucket_bytes, o->grad_wire);
    dt_zero_opts z = o->zero;
    z.wire = o->grad_wire;
    return dt_zero_strategy(S, &z);
}

/* The mesh's places, or every rank holding the whole model. */
static int ddp_places(const dt_places_job *j, dt_places *out, char *err, size_t n)
{
    if (on_mesh(j->o)) return dt_mesh_places(j, out, err, n);
    return dt_places_whole(out, j->world, err, n);
}

int dt_data_parallel_on(dt_strategy *S, dt_comm *group, const dt_parallel_opts *o)
{
    if (o->zero.stage == 0) return dt_ddp_strategy_on(S, group, 1, o->bucket_bytes, o->grad_wire);
    dt_zero_opts z = o->zero;
    z.wire = o->grad_wire;
    return dt_zero_strategy_on(S, group, 1, &z);
}

/* Naive data parallelism runs its devices as threads of one process. */
static int dp_size(const dt_parallel_opts *o, int world, int *dp, char *err, size_t n)
{
    if (world > 1)
        return dt_strf(err, n, "--strategy dp runs in one process (its devices are threads); "
                       "this job has %d ranks: use --strategy ddp across processes", world), -1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    *dp = o->devices > 0 ? o->devices : (int)(cores > 0 ? cores : 1);
    return 0;
}

static int dp_build(dt_strategy *S, const dt_parallel_opts *o)
{
    int devices;
    if (dp_size(o, S->rank->size, &devices, S->rank->err, sizeof S->rank->err)) return -1;
    return devices > 1 ? dt_naive_dp_strategy(S, devices) : 0;
}

static int ps_size(const dt_parallel_opts *o, int world, int *dp, char *err, size_t n)
{
    if (world <= o->servers)
        return dt_strf(err, n, "--strategy ps with %d server%s needs at least %d ranks "
                       "(servers + workers); this job has %d: start it with --nproc",
                       o->servers, o->servers > 1 ? "s" : "", o->servers + 1, world), -1;
    *dp = world - o->servers;
    return 0;
}

/* Naive DP's devices and the parameter server's ranks hold different
 * things by arithmetic nobody has written: they have no places. */
static const dt_strategy_kind builtin[] = {
    {"ddp", "every rank holds the model; gradients all-reduced in buckets during backward",
     ddp_size, ddp_build, ddp_places},
    {"dp", "naive data parallelism: devices as threads of one process, a main device",
     dp_size, dp_build, NULL},
    {"ps", "parameter server: the last --servers ranks hold the parameters, workers push",
     ps_size, dt_ps_strategy, NULL},
};

#define MAX_EXTRA 8
static const dt_strategy_kind *extra[MAX_EXTRA];
static int nextra;

const dt_strategy_kind *dt_strategy_find(const char *name)
{
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        if (strcmp(builtin[i].name, name) == 0) return &builtin[i];
    for (int i = 0; i < nextra; i++)
        if (strcmp(extra[i]->name, name) == 0) return extra[i];
    return NULL;
}

int dt_strategy_register(const dt_strategy_kind *kind)
{
    if (nextra == MAX_EXTRA || dt_strategy_find(kind->name)) return -1;
    extra[nextra++] = kind;
    return 0;
}

void dt_strategy_names(char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0] && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? "|" : "", builtin[i].name);
    for (int i = 0; i < nextra && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "|%s", extra[i]->name);
}
