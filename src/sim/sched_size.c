/*
 * Counting what an algorithm records (sched_size.h). Each count follows
 * its algorithm's code in src/comm/algo, over all ranks at once:
 *
 *   p ranks; q the largest power of two <= p, e = p - q the extra ranks
 *   that fold in and out (fold.c), lg = lg q rounds among the others;
 *   clg = ceil(lg p), Bruck's rounds.
 *
 * A step with no operation is not recorded (coll.c), and ring passes skip
 * empty blocks: a ring pass over m members of k non-empty blocks (the
 * first k; fewer elements than members leave the rest empty) records
 * (m - 1) min(k + 1, m) steps of 2 k (m - 1) operations in all. A local
 * copy or reduction is recorded when it takes time: bytes to move, and a
 * rate of the model's that is not free.
 */
#include "sim/sched_size.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


typedef struct {
    double p, q, e, lg, clg;
    double n;           /* the algorithm's n: elements, or bytes (dt_algo_arg_n) */
    int copy, reduce;   /* local copies, local reductions take time */
    const dt_sim_world *w; /* the hosts, for hier */
} shape;

typedef void (*count_fn)(const shape *s, dt_sim_entries *e);

static void add(dt_sim_entries *e, double steps, double ops, double locals)
{
    e->steps += steps;
    e->ops += ops;
    e->locals += locals;
}

/* ---- the pieces the algorithms share ----------------------------------------- */

/* One reduce-scatter or all-gather pass round a ring of m members over
 * `total` units cut in m blocks (ring_blocks.c). */
static void ring_pass(dt_sim_entries *e, double m, double total)
{
    double k = total < m ? total : m;
    if (m < 2 || k < 1) return;
    add(e, (m - 1) * (k + 1 < m ? k + 1 : m), 2 * k * (m - 1), 0);
}

/* A binomial reduce over m members (reduce_binomial.c): a send from every
 * member but the root, a receive for each; a root alone copies. */
static void binomial_reduce(const shape *s, dt_sim_entries *e, double m)
{
    add(e, 2 * (m - 1), 2 * (m - 1), m == 1 && s->copy ? 1 : 0);
}

/* A binomial broadcast over m members (broadcast_binomial.c): a receive
 * for every member but the root, and one step of sends for each member
 * with a child: the root and the even members below m - 1. */
static void binomial_bcast(dt_sim_entries *e, double m)
{
    add(e, (m - 1) + floor(m / 2), 2 * (m - 1), 0);
}

/* Recursive doubling or halving with folded extra ranks over virtual
 * blocks (allgather_rd.c, reduce_scatter_halving.c): each round's two
 * runs a side, the second only where its first block is below e. */
static void doubling_runs(const shape *s, dt_sim_entries *e)
{
    double ops = 4 * s->e;
    for (double mask = 1; mask < s->q; mask *= 2) {
        double low = mask * ceil(s->e / mask);
        ops += 2 * s->q + 2 * (low < s->q ? low : s->q);
    }
    add(e, 4 * s->e + s->q * s->lg, ops, 0);
}

/* ---- all-reduce ----------------------------------------------------------------- */

static void ar_ring(const shape *s, dt_sim_entries *e)
{
    ring_pass(e, s->p, s->n);
    ring_pass(e, s->p, s->n);
}

/* Folds (a step each way for 2e ranks), then halving and doubling. */
static void ar_rhd(const shape *s, dt_sim_entries *e)
{
    add(e, 4 * s->e + 2 * s->q * s->lg, 4 * s->e + 4 * s->q * s->lg, 0);
}

static void ar_butterfly(const shape *s, dt_sim_entries *e)
{
    add(e, 4 * s->e + s->q * s->lg, 4 * s->e + 2 * s->q * s->lg, 0);
}

static void ar_tree(const shape *s, dt_sim_entries *e)
{
    binomial_reduce(s, e, s->p);
    binomial_bcast(e, s->p);
}

/* Hosts of equal size L: rings inside each host around a ring per column
 * of H hosts (column b all-reduces block b of the host's cut), a copy in
 * place of the host's rings when L = 1. Otherwise leaders: a binomial
 * reduce and broadcast inside each host around a ring of the leaders. */
static void ar_hier(const shape *s, dt_sim_entries *e)
{
    const dt_sim_world *w = s->w;
    int hosts = 0, L = 0, uniform = 1, H = 0;
    for (int r = 0; r < w->ranks; r++)
        if (w->host_of[r] >= hosts) hosts = w->host_of[r] + 1;
    int *count = calloc((size_t)hosts, sizeof *count);
    if (!count) return;
    for (int r = 0; r < w->ranks; r++) count[w->host_of[r]]++;
    for (int h = 0; h < hosts; h++) {
        if (!count[h]) continue;
        H++;
        if (L && count[h] != L) uniform = 0;
        L = count[h];
    }
    if (uniform) {
        for (int b = 0; b < L; b++) {
            double len = (double)dt_block_len((size_t)s->n, L, b);
            ring_pass(e, H, len);
            ring_pass(e, H, len);
        }
        dt_sim_entries host = {0}; /* a host's two passes, alike on every host */
        ring_pass(&host, L, s->n);
        add(e, 2 * H * host.steps, 2 * H * host.ops, L == 1 && s->copy ? s->p : 0);
    } else {
        for (int h = 0; h < hosts; h++)
            if (count[h]) binomial_reduce(s, e, count[h]), binomial_bcast(e, count[h]);
        ring_pass(e, H, s->n);
        ring_pass(e, H, s->n);
    }
    free(count);
}

/* Every rank pushes and pulls; the server receives one at a time and
 * sends 32 at a time. */
static void ar_ps(const shape *s, dt_sim_entries *e)
{
    add(e, 3 * (s->p - 1) + ceil((s->p - 1) / 32), 4 * (s->p - 1), 0);
}

/* Exchanges with 16 peers a step, then p - 1 reductions a rank. */
static void ar_naive(const shape *s, dt_sim_entries *e)
{
    double pp = s->p * (s->p - 1);
    add(e, s->p * ceil((s->p - 1) / 16), 2 * pp, s->reduce ? pp : 0);
}

/* ---- broadcast, all-gather ------------------------------------------------------ */

static void bc_binomial(const shape *s, dt_sim_entries *e) { binomial_bcast(e, s->p); }

/* The root sends the k - 1 non-empty blocks but its own, 32 a step; a
 * ring all-gather of the bytes follows. */
static void bc_scatter_allgather(const shape *s, dt_sim_entries *e)
{
    double k = s->n < s->p ? s->n : s->p;
    add(e, ceil((k - 1) / 32) + (k - 1), 2 * (k - 1), 0);
    ring_pass(e, s->p, s->n);
}

static void ag_ring(const shape *s, dt_sim_entries *e) { ring_pass(e, s->p, s->n * s->p); }

/* Every rank but 0 copies its block in and rotates the result out (one
 * copy fewer on the last rank). */
static void ag_bruck(const shape *s, dt_sim_entries *e)
{
    add(e, s->p * s->clg, 2 * s->p * s->clg, s->copy ? 3 * s->p - 4 : 0);
}

/* ---- reduce-scatter, all-to-all ----------------------------------------------- */

static void quadratic(const shape *s, dt_sim_entries *e)
{
    add(e, s->p * (s->p - 1), 2 * s->p * (s->p - 1), 0);
}

/* A copy of its own block, exchanges with 16 peers a step, p - 1
 * reductions. */
static void rs_direct(const shape *s, dt_sim_entries *e)
{
    double pp = s->p * (s->p - 1);
    add(e, s->p * ceil((s->p - 1) / 16), 2 * pp, (s->copy ? s->p : 0) + (s->reduce ? pp : 0));
}

/* Copies: the rotation in (two, one on rank 0), each round's pack and
 * unpack of the runs of positions with its bit set, and three a pair in
 * the inverse rotation (p (p - 1) / 2 pairs over all ranks). */
static void a2a_bruck(const shape *s, dt_sim_entries *e)
{
    double runs = 0;
    for (double bit = 1; bit < s->p; bit *= 2) runs += ceil((s->p - bit) / (2 * bit));
    double copies = 2 * s->p - 1 + 2 * s->p * runs + 1.5 * s->p * (s->p - 1);
    add(e, s->p * s->clg, 2 * s->p * s->clg, s->copy ? copies : 0);
}

/* Every peer's exchange posted at once, 32 peers a step (alltoallv_linear.c). */
static void a2av_linear(const shape *s, dt_sim_entries *e)
{
    add(e, s->p * ceil((s->p - 1) / 32), 2 * s->p * (s->p - 1), 0);
}

/* ---- the table ------------------------------------------------------------------ */

static const struct {
    dt_coll_kind kind;
    const char *name;
    count_fn count;
} counts[] = {
    {DT_COLL_ALLREDUCE, "ring", ar_ring},
    {DT_COLL_ALLREDUCE, "rhd", ar_rhd},
    {DT_COLL_ALLREDUCE, "butterfly", ar_butterfly},
    {DT_COLL_ALLREDUCE, "tree", ar_tree},
    {DT_COLL_ALLREDUCE, "hier", ar_hier},
    {DT_COLL_ALLREDUCE, "ps", ar_ps},
    {DT_COLL_ALLREDUCE, "naive", ar_naive},
    {DT_COLL_BROADCAST, "binomial", bc_binomial},
    {DT_COLL_BROADCAST, "scatter_allgather", bc_scatter_allgather},
    {DT_COLL_ALLGATHER, "ring", ag_ring},
    {DT_COLL_ALLGATHER, "rd", doubling_runs},
    {DT_COLL_ALLGATHER, "bruck", ag_bruck},
    {DT_COLL_REDUCE_SCATTER, "ring", quadratic},
    {DT_COLL_REDUCE_SCATTER, "halving", doubling_runs},
    {DT_COLL_REDUCE_SCATTER, "direct", rs_direct},
    {DT_COLL_ALLTOALL, "pairwise", quadratic},
    {DT_COLL_ALLTOALL, "bruck", a2a_bruck},
    {DT_COLL_ALLTOALLV, "pairwise", quadratic},
    {DT_COLL_ALLTOALLV, "linear", a2av_linear},
};

int dt_sim_sched_entries(const dt_sim_world *w, const dt_algo *al, const dt_coll_args *a,
                         dt_sim_entries *out)
{
    memset(out, 0, sizeof *out);
    const int p = w->ranks, q = dt_pow2_floor(p);
    shape s = {.p = p, .q = q, .e = p - q, .n = (double)dt_algo_arg_n(a), .w = w};
    while ((1 << (int)s.lg) < q) s.lg++;
    while ((1 << (int)s.clg) < p) s.clg++;
    /* A reduction's rate is the rank's own link's (predict.c). */
    s.copy = w->model.copy > 0;
    s.reduce = dt_sim_world_cost(w, 0, 0)->gamma > 0;
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (counts[i].kind == al->kind && !strcmp(counts[i].name, al->name)) {
            if (p > 1 && s.n > 0) counts[i].count(&s, out);
            return 0;
        }
    return -1;
}

/* Bytes of v as a variable-length integer (coll.c's put_varint). */
static double varint_len(double v)
{
    double n = 1;
    for (; v >= 128; v = floor(v / 128)) n++;
    return n;
}

void dt_sim_sched_bytes(const dt_sim_world *w, size_t bytes, const dt_sim_entries *e,
                        double *lo, double *hi)
{
    /* An op: its peer's distance, zigzagged and shifted past the kind,
     * then its bytes; a step's header counts its ops (at most 64); a
     * local entry is a one-byte header and a double. */
    double peer = varint_len(8.0 * (w->ranks - 1) + 3), size = varint_len((double)bytes);
    *lo = e->steps + 2 * e->ops + 9 * e->locals;
    *hi = 2 * e->steps + (peer + size) * e->ops + 9 * e->locals;
}
