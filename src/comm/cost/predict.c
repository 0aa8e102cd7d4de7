/*
 * Predicting an algorithm's time by running it dry. A stand-in
 * communicator with c->dry set plays one rank: the algorithm runs its real
 * schedule, but dt_p2p_run hands each step to the dry run instead of
 * moving it, and the local steps hand it their copies and reductions, and
 * the run costs them. The schedules that move the data are the schedules
 * that are costed, so the model cannot drift from the code, and any rank
 * count can be costed on one process.
 *
 * A step's time: its sends and its receives proceed at once (full duplex),
 * each side paying alpha + beta * bytes per message, plus gamma per byte
 * reduced. A rank's time is the sum of its steps; the collective's, that
 * of its slowest rank (the root of a parameter server, a fold partner).
 * Contention between links that share a memory system or a NIC is not
 * modelled; calibration measures one pair at a time. `dtrain simulate`
 * models it: with a hook (dry.h) the same dry runs record each rank's
 * steps instead of costing them, and src/sim plays them over shared links.
 */
#include <stdint.h>
#include <string.h>

#include "comm/algo/blocks.h"
#include "comm/comm_internal.h"
#include "comm/cost/dry.h"
#include "comm/topo.h"

/* Where a dry run's buffers "are": never dereferenced. */
#define FAKE_SEND ((const void *)(uintptr_t)(1ull << 44))
#define FAKE_RECV ((void *)(uintptr_t)(2ull << 44))
#define FAKE_SCRATCH ((void *)(uintptr_t)(3ull << 44))

/* A dry run's state: the hook the stand-in's layers call (comm_internal.h)
 * and what it does with their work, summed or handed on. */
typedef struct {
    dt_dry_run base;
    const dt_cost_model *m;
    double seconds;          /* summed when hook is NULL */
    const dt_dry_hook *hook; /* NULL: cost, do not record */
} dry_run;

/* What a link of the kind topo says joins us to peer costs. */
static const dt_link_cost *link_cost(const dry_run *d, const dt_comm *c, int peer)
{
    return &d->m->link[dt_topo_link(c, c->rank, peer)];
}

/* Local work's seconds: summed, or handed to the recorder. */
static void add_local(dry_run *d, double seconds)
{
    if (d->hook)
        d->hook->local(d->hook->arg, seconds);
    else
        d->seconds += seconds;
}

/* The step as the hook sees it: the ops' kinds, peers and sizes. */
static void record_step(dry_run *d, const dt_p2p *ops, int n)
{
    dt_dry_op view[DT_P2P_MAX_OPS];
    for (int i = 0; i < n; i++) view[i] = (dt_dry_op){ops[i].kind, ops[i].peer, ops[i].bytes};
    d->hook->step(d->hook->arg, view, n);
}

static void dry_step(dt_dry_run *base, const dt_comm *c, const dt_p2p *ops, int n)
{
    dry_run *d = (dry_run *)base;
    if (d->hook) {
        record_step(d, ops, n);
        return;
    }
    double out = 0, in = 0, reduce = 0;
    for (int i = 0; i < n; i++) {
        const dt_link_cost *l = link_cost(d, c, ops[i].peer);
        double t = l->alpha + l->beta * (double)ops[i].bytes;
        if (ops[i].kind == DT_P2P_SEND) {
            out += t;
        } else {
            in += t;
            if (ops[i].kind == DT_P2P_RECV_REDUCE) reduce += l->gamma * (double)ops[i].bytes;
        }
    }
    d->seconds += (out > in ? out : in) + reduce;
}

static void dry_copy(dt_dry_run *base, const dt_comm *c, size_t bytes)
{
    (void)c;
    dry_run *d = (dry_run *)base;
    add_local(d, d->m->copy * (double)bytes);
}

static void dry_reduce(dt_dry_run *base, const dt_comm *c, size_t n)
{
    dry_run *d = (dry_run *)base;
    double bytes = (double)(n * dt_dtype_size(c->cur.dtype));
    add_local(d, link_cost(d, c, c->rank)->gamma * bytes);
}

static dry_run dry_run_of(const dt_comm *like, const dt_dry_hook *hook)
{
    return (dry_run){{dry_step, dry_copy, dry_reduce, FAKE_SCRATCH}, &like->job->model, 0, hook};
}

/* Ranks whose times bound the collective's: all of them up to 64, else
 * the ones where the schedules differ (ends, the middle, around the power
 * of two where folding starts) plus a stride through the rest. */
static int sample_ranks(int p, int *out, int cap)
{
    int n = 0;
    if (p <= cap) {
        for (int r = 0; r < p; r++) out[n++] = r;
        return n;
    }
    int q = dt_pow2_floor(p);
    int fixed[] = {0, 1, 2, p / 2, q - 1, q < p ? q : 0, p - 2, p - 1};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) out[n++] = fixed[i];
    for (int r = 3; n < cap; r += p / (cap - 8) + 1) out[n++] = r % p;
    return n;
}

/* Rank `rank` of al for call a, dry on a stand-in of `like`. */
static int run_rank(const dt_comm *like, const dt_algo *al, const dt_coll_args *a, int rank,
                    dry_run *d)
{
    static _Thread_local dt_comm stand_in; /* big; one per thread, reused */
    dt_comm *f = &stand_in;
    memset(f, 0, sizeof *f);
    f->job = like->job;
    f->size = like->size;
    f->rank = rank;
    f->host_of = like->host_of;
    f->nhosts = like->nhosts;
    f->cur = *a;
    f->dry = &d->base;
    return al->run(f, FAKE_SEND, FAKE_RECV, dt_algo_arg_n(a), a->root);
}

int dt_dry_run_rank(const dt_comm *like, const dt_algo *al, const dt_coll_args *a, int rank,
                    const dt_dry_hook *hook)
{
    dry_run d = dry_run_of(like, hook);
    return run_rank(like, al, a, rank, &d);
}

double dt_cost_predict(dt_comm *c, const dt_algo *al, const dt_coll_args *a)
{
    if (al->flags & DT_ALGO_NEEDS_MPI) return -1; /* MPI's insides are not ours to cost */
    if (c->size == 1) return 0;
    int ranks[64];
    int n = sample_ranks(c->size, ranks, 64);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        dry_run d = dry_run_of(c, NULL);
        if (run_rank(c, al, a, ranks[i], &d) < 0)
            return -1; /* it could not run here: not a candidate */
        if (d.seconds > worst) worst = d.seconds;
    }
    return worst;
}
