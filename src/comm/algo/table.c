/*
 * Which algorithm runs a collective. The table names every algorithm;
 * DTRAIN_<COLLECTIVE>_ALGO or dt_comm_set_algo forces one (for the calls
 * issued after it: the choice is fixed when a call is issued); otherwise
 * `auto` costs each candidate with the job's model (a dry run, see
 * cost/predict.c) and takes the cheapest. The choice depends only on the
 * collective, the message size (rounded up to a power of two), the
 * communicator's layout and the model, which rank 0 gave every rank, so
 * every rank picks the same algorithm without talking.
 */
#include <stdio.h>
#include <string.h>

#include "comm/algo/algorithms.h"
#include "comm/cost/dry.h"
#include "core/env.h"

const dt_algo dt_algo_table[] = {
    /* Order breaks ties: simpler and more bandwidth-friendly first. */
    {"ring", DT_COLL_ALLREDUCE, dt_allreduce_ring, 0,
     "reduce-scatter then all-gather round a ring: 2(p-1) steps, bandwidth-optimal"},
    {"rhd", DT_COLL_ALLREDUCE, dt_allreduce_rhd, 0,
     "Rabenseifner: recursive-halving reduce-scatter, recursive-doubling all-gather"},
    {"butterfly", DT_COLL_ALLREDUCE, dt_allreduce_butterfly, 0,
     "recursive doubling: lg p exchanges of the whole vector, latency-optimal"},
    {"tree", DT_COLL_ALLREDUCE, dt_allreduce_tree, 0,
     "binomial-tree reduce to rank 0, then binomial broadcast"},
    {"hier", DT_COLL_ALLREDUCE, dt_allreduce_hier, 0,
     "reduce-scatter inside each host, all-reduce across hosts, all-gather inside"},
    {"ps", DT_COLL_ALLREDUCE, dt_allreduce_ps, 0,
     "parameter server: rank 0 gathers and reduces everything, then sends it back"},
    {"naive", DT_COLL_ALLREDUCE, dt_allreduce_naive, 0,
     "every rank sends its whole vector to every other rank and reduces all"},
    {"mpi", DT_COLL_ALLREDUCE, dt_allreduce_mpi, DT_ALGO_NO_AUTO | DT_ALGO_NEEDS_MPI,
     "MPI_Allreduce of the MPI library underneath"},

    {"binomial", DT_COLL_BROADCAST, dt_broadcast_binomial, 0,
     "binomial tree from the root: lg p rounds of the whole message"},
    {"scatter_allgather", DT_COLL_BROADCAST, dt_broadcast_scatter_allgather, 0,
     "van de Geijn: scatter blocks from the root, then a ring all-gather"},
    {"mpi", DT_COLL_BROADCAST, dt_broadcast_mpi, DT_ALGO_NO_AUTO | DT_ALGO_NEEDS_MPI,
     "MPI_Bcast of the MPI library underneath"},

    {"ring", DT_COLL_ALLGATHER, dt_allgather_ring, 0, "p-1 steps round a ring"},
    {"rd", DT_COLL_ALLGATHER, dt_allgather_rd, 0,
     "recursive doubling: lg p exchanges of doubling size"},
    {"bruck", DT_COLL_ALLGATHER, dt_allgather_bruck, 0,
     "Bruck: ceil(lg p) steps for any p, then a local rotation"},
    {"mpi", DT_COLL_ALLGATHER, dt_allgather_mpi, DT_ALGO_NO_AUTO | DT_ALGO_NEEDS_MPI,
     "MPI_Allgather of the MPI library underneath"},

    {"ring", DT_COLL_REDUCE_SCATTER, dt_reduce_scatter_ring, 0, "p-1 steps round a ring"},
    {"halving", DT_COLL_REDUCE_SCATTER, dt_reduce_scatter_halving, 0,
     "recursive halving: lg p exchanges of halving size"},
    {"direct", DT_COLL_REDUCE_SCATTER, dt_reduce_scatter_direct, DT_ALGO_NO_AUTO,
     "each block sent to its owner and summed there in rank order (same bits as naive)"},
    {"mpi", DT_COLL_REDUCE_SCATTER, dt_reduce_scatter_mpi, DT_ALGO_NO_AUTO | DT_ALGO_NEEDS_MPI,
     "MPI_Reduce_scatter_block of the MPI library underneath"},

    {"pairwise", DT_COLL_ALLTOALL, dt_alltoall_pairwise, 0,
     "p-1 steps, each a permutation: send s ahead, receive s behind"},
    {"bruck", DT_COLL_ALLTOALL, dt_alltoall_bruck, 0,
     "Bruck: ceil(lg p) steps of packed blocks, for small messages"},
    {"mpi", DT_COLL_ALLTOALL, dt_alltoall_mpi, DT_ALGO_NO_AUTO | DT_ALGO_NEEDS_MPI,
     "MPI_Alltoall of the MPI library underneath"},

    /* The model never prices linear above pairwise (their messages are the
     * same, and linear waits for none of them in turn), and on shared
     * memory it measured faster up to 1 MiB and no slower above: linear
     * first. Pairwise is there to be forced where many senders at once
     * would contend for a link, which the model does not see. */
    {"linear", DT_COLL_ALLTOALLV, dt_alltoallv_linear, 0,
     "every send and receive posted at once, so small and uneven blocks overlap"},
    {"pairwise", DT_COLL_ALLTOALLV, dt_alltoallv_pairwise, 0,
     "p-1 steps, each a permutation: send s ahead, receive s behind, blocks of any size"},
    {"mpi", DT_COLL_ALLTOALLV, dt_alltoallv_mpi, DT_ALGO_NO_AUTO | DT_ALGO_NEEDS_MPI,
     "MPI_Alltoallv of the MPI library underneath"},
};
const int dt_algo_count = (int)(sizeof dt_algo_table / sizeof dt_algo_table[0]);

static const dt_coll_kind selectable[] = {DT_COLL_ALLREDUCE, DT_COLL_BROADCAST, DT_COLL_ALLGATHER,
                                          DT_COLL_REDUCE_SCATTER, DT_COLL_ALLTOALL,
                                          DT_COLL_ALLTOALLV};
#define NSELECTABLE ((int)(sizeof selectable / sizeof selectable[0]))

int dt_algo_find(dt_coll_kind k, const char *name)
{
    for (int i = 0; i < dt_algo_count; i++)
        if (dt_algo_table[i].kind == k && !strcmp(dt_algo_table[i].name, name)) return i;
    return -1;
}

static dt_coll_kind kind_named(const char *coll)
{
    for (int i = 0; i < NSELECTABLE; i++)
        if (!strcmp(dt_coll_name(selectable[i]), coll)) return selectable[i];
    return DT_COLL_NONE;
}

/* "auto, ring, rhd, ..." for messages. */
static void list_choices(dt_coll_kind k, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "auto");
    for (int i = 0; i < dt_algo_count && o < len; i++)
        if (dt_algo_table[i].kind == k) o += (size_t)snprintf(buf + o, len - o, ", %s", dt_algo_table[i].name);
}

int dt_algo_usable(const dt_comm *c, const dt_algo *al, char *why, size_t len)
{
    if ((al->flags & DT_ALGO_NEEDS_MPI) && !c->mpi) {
        snprintf(why, len,
                 "%s algorithm 'mpi' needs ranks started by mpirun and dtrain built with "
                 "Open MPI (%s)",
                 dt_coll_name(al->kind), dt_have_mpi() ? "this run is not under mpirun"
                                                        : "this dtrain was built without it");
        return 0;
    }
    return 1;
}

/* Parse name for kind k into *idx (DT_ALGO_AUTO for "auto"). */
static int parse_algo(const dt_comm *c, dt_coll_kind k, const char *name, const char *where,
                      int *idx, char *err, size_t len)
{
    if (!strcmp(name, "auto")) {
        *idx = DT_ALGO_AUTO;
        return 0;
    }
    int i = dt_algo_find(k, name);
    if (i < 0) {
        char choices[256];
        list_choices(k, choices, sizeof choices);
        snprintf(err, len, "%s: '%s' is not one of the %s algorithms (choices: %s)", where, name,
                 dt_coll_name(k), choices);
        return DT_ERR_INVALID;
    }
    if (!dt_algo_usable(c, &dt_algo_table[i], err, len)) return DT_ERR_INVALID;
    *idx = i;
    return 0;
}

int dt_algo_read_env(dt_comm *c, char *err, size_t len)
{
    for (int k = 0; k < DT_COLL_KIND_COUNT; k++) c->algo_forced[k] = DT_ALGO_AUTO;
    for (int i = 0; i < NSELECTABLE; i++) {
        char var[64];
        const char *name = dt_coll_name(selectable[i]);
        size_t o = (size_t)snprintf(var, sizeof var, "DTRAIN_");
        for (const char *s = name; *s && o + 1 < sizeof var; s++) var[o++] = (char)(*s >= 'a' && *s <= 'z' ? *s - 32 : *s);
        snprintf(var + o, sizeof var - o, "_ALGO");
        const char *v = dt_env_str(var);
        if (!v) continue;
        char where[96];
        snprintf(where, sizeof where, "%s=%s", var, v);
        int rc = parse_algo(c, selectable[i], v, where, &c->algo_forced[selectable[i]], err, len);
        if (rc) return rc;
    }
    return 0;
}

/* Bytes per element of a call's size in the nccl-tests sense: all
 * ranks' data for all-gather, reduce-scatter and all-to-all. An
 * all-to-all-v's size is its largest per-peer message (its count, see
 * cheapest). */
static size_t bytes_per_count(const dt_comm *c, const dt_coll_args *a)
{
    size_t b = dt_dtype_size(a->dtype);
    if (a->kind == DT_COLL_ALLGATHER || a->kind == DT_COLL_REDUCE_SCATTER ||
        a->kind == DT_COLL_ALLTOALL)
        b *= (size_t)c->size;
    return b;
}

static int size_class(size_t bytes)
{
    int b = 0;
    while (b < 63 && ((size_t)1 << b) < bytes) b++;
    return b;
}

/* The cheapest usable candidate for calls of size class b, costed at 2^b.
 * An all-to-all-v is priced as a uniform one whose every message is the
 * call's largest per-peer message, sent or received (rep.v cleared): the
 * largest block is what the slowest step of any schedule moves, and it is
 * one number each rank knows without asking the others. Ranks with other
 * counts may so choose another algorithm; all of them send each peer the
 * same one message (algorithms.h), so they interoperate. */
static int cheapest(dt_comm *c, const dt_coll_args *a, int b)
{
    dt_coll_args rep = *a;
    rep.count = ((size_t)1 << b) / bytes_per_count(c, a);
    if (rep.count == 0) rep.count = 1;
    rep.v = (dt_coll_v){0};
    int best = -1;
    double best_t = 0;
    for (int i = 0; i < dt_algo_count; i++) {
        const dt_algo *al = &dt_algo_table[i];
        if (al->kind != a->kind || (al->flags & DT_ALGO_NO_AUTO)) continue;
        double t = dt_cost_predict(c, al, &rep);
        if (t >= 0 && (best < 0 || t < best_t)) best = i, best_t = t;
    }
    return best;
}

int dt_algo_pick(dt_comm *c, const dt_coll_args *a, const dt_algo **out)
{
    int i = a->algo;
    if (i == DT_ALGO_AUTO) {
        unsigned v = atomic_load(&c->job->model_version);
        if (c->model_seen != v) {
            memset(c->auto_choice, -1, sizeof c->auto_choice);
            c->model_seen = v;
        }
        int b = size_class(a->count * bytes_per_count(c, a));
        if (c->auto_choice[a->kind][b] < 0) c->auto_choice[a->kind][b] = (signed char)cheapest(c, a, b);
        i = c->auto_choice[a->kind][b];
    }
    if (i < 0 || i >= dt_algo_count)
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "no %s algorithm to run", dt_coll_name(a->kind));
    char why[256];
    if (!dt_algo_usable(c, &dt_algo_table[i], why, sizeof why))
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "%s", why);
    *out = &dt_algo_table[i];
    return 0;
}

/* ---- public ---------------------------------------------------------------- */

int dt_comm_set_algo(dt_comm *c, const char *collective, const char *algo)
{
    if (!c || !collective || !algo) return DT_ERR_INVALID;
    dt_coll_kind k = kind_named(collective);
    if (k == DT_COLL_NONE) {
        snprintf(c->err, sizeof c->err,
                 "dt_comm_set_algo: '%s' is not a collective with a choice of algorithms "
                 "(allreduce, broadcast, allgather, reduce_scatter, alltoall, alltoallv)",
                 collective);
        return DT_ERR_INVALID;
    }
    char where[96];
    snprintf(where, sizeof where, "dt_comm_set_algo(%s)", collective);
    return parse_algo(c, k, algo, where, &c->algo_forced[k], c->err, sizeof c->err);
}

int dt_comm_algo_names(const char *collective, const char **names, int max)
{
    dt_coll_kind k = collective ? kind_named(collective) : DT_COLL_NONE;
    if (k == DT_COLL_NONE) return DT_ERR_INVALID;
    int n = 0;
    for (int i = 0; i < dt_algo_count; i++)
        if (dt_algo_table[i].kind == k) {
            if (n < max) names[n] = dt_algo_table[i].name;
            n++;
        }
    return n;
}

static int args_for(dt_comm *c, const char *collective, size_t count, dt_dtype t, dt_coll_args *a)
{
    dt_coll_kind k = collective ? kind_named(collective) : DT_COLL_NONE;
    if (!c || k == DT_COLL_NONE || (unsigned)t >= DT_DTYPE_COUNT) return DT_ERR_INVALID;
    *a = (dt_coll_args){.kind = k, .count = count, .dtype = t, .op = DT_SUM, .root = 0,
                        .algo = c->algo_forced[k]};
    return 0;
}

const char *dt_comm_algo_for(dt_comm *c, const char *collective, size_t count, dt_dtype t)
{
    dt_coll_args a;
    const dt_algo *al;
    if (args_for(c, collective, count, t, &a)) return NULL;
    if (c->size == 1) return "self";
    if (dt_algo_pick(c, &a, &al)) return NULL;
    return al->name;
}

double dt_comm_predict_us(dt_comm *c, const char *collective, const char *algo, size_t count,
                          dt_dtype t)
{
    dt_coll_args a;
    if (args_for(c, collective, count, t, &a) || !algo) return -1;
    int i = dt_algo_find(a.kind, algo);
    if (i < 0) return -1;
    double s = dt_cost_predict(c, &dt_algo_table[i], &a);
    return s < 0 ? -1 : s * 1e6;
}

const char *dt_comm_algo_summary(const char *collective, const char *algo)
{
    dt_coll_kind k = collective ? kind_named(collective) : DT_COLL_NONE;
    int i = k == DT_COLL_NONE || !algo ? -1 : dt_algo_find(k, algo);
    return i < 0 ? NULL : dt_algo_table[i].summary;
}
