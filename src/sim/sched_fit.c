/* Whether a recording can fit, and what would fit instead
 * (sched_size.h). */
#include <stdio.h>

#include "comm/cost/dry.h"
#include "sim/coll.h"
#include "sim/sched_size.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* The bounds of al's recording of a on w, in bytes; -1 without a closed
 * form. */
static int bounds(const dt_sim_world *w, const dt_algo *al, const dt_coll_args *a,
                  dt_sim_entries *e, double *lo, double *hi)
{
    if (dt_sim_sched_entries(w, al, a, e)) return -1;
    dt_sim_sched_bytes(w, dt_sim_coll_bytes(a, w->ranks), e, lo, hi);
    return 0;
}

/* Whether al can run on w at all, in the simulator (never MPI's). */
static int usable(const dt_sim_world *w, const dt_algo *al)
{
    char why[256];
    return !(al->flags & DT_ALGO_NEEDS_MPI) && dt_algo_usable(w->comm, al, why, sizeof why);
}

/* Whether al's recording of `bytes` of kind surely fits in cap at `ranks`
 * ranks, hosts as w's. */
static int fits_at(const dt_sim_world *w, const dt_algo *al, size_t bytes, int ranks, double cap)
{
    dt_sim_world t;
    char err[256];
    if (dt_sim_world_init(&t, ranks, w->per_host, &w->model, err, sizeof err)) return 0;
    dt_coll_args a = dt_sim_coll_call(al->kind, bytes, ranks);
    dt_sim_entries e;
    double lo, hi;
    int ok = usable(&t, al) && bounds(&t, al, &a, &e, &lo, &hi) == 0 && hi <= cap;
    dt_sim_world_free(&t);
    return ok;
}

/* The most ranks, a multiple of w's a host and at most w's, at which
 * fits_at holds (recordings grow with the ranks); 0 for none. */
static int most_ranks(const dt_sim_world *w, const dt_algo *al, size_t bytes, double cap)
{
    int lo = 0, hi = w->ranks / w->per_host;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (fits_at(w, al, bytes, mid * w->per_host, cap)) lo = mid;
        else hi = mid - 1;
    }
    return lo * w->per_host;
}

/* None fits on w: the algorithm that fits the most ranks, and how many. */
static void fewer_ranks(dt_sim_world *w, const dt_coll_args *a, double cap, char *err,
                        size_t len)
{
    const dt_algo *most = NULL;
    int most_p = 0;
    size_t bytes = dt_sim_coll_bytes(a, w->ranks);
    for (int i = 0; i < dt_algo_count; i++) {
        const dt_algo *x = &dt_algo_table[i];
        if (x->kind != a->kind || (x->flags & DT_ALGO_NEEDS_MPI)) continue;
        int p = most_ranks(w, x, bytes, cap);
        if (p > most_p) most = x, most_p = p;
    }
    if (most)
        snprintf(err, len, "no %s algorithm's schedule fits at %d ranks; at most %d ranks "
                 "would, by --algo %s", dt_coll_name(a->kind), w->ranks, most_p, most->name);
    else
        snprintf(err, len, "no %s algorithm's schedule fits at %d ranks, nor at fewer",
                 dt_coll_name(a->kind), w->ranks);
}

void dt_sim_sched_suggest(dt_sim_world *w, const dt_algo *al, const dt_coll_args *a, double cap,
                          char *err, size_t len)
{
    const dt_algo *best = NULL;
    double best_s = 0, best_hi = 0;
    for (int i = 0; i < dt_algo_count; i++) {
        const dt_algo *x = &dt_algo_table[i];
        dt_sim_entries e;
        double lo, hi;
        if (x->kind != al->kind || x == al || !usable(w, x) || bounds(w, x, a, &e, &lo, &hi) ||
            hi > cap)
            continue;
        double s = dt_cost_predict(w->comm, x, a);
        if (s >= 0 && (!best || s < best_s)) best = x, best_s = s, best_hi = hi;
    }
    if (!best) {
        fewer_ranks(w, a, cap, err, len);
        return;
    }
    snprintf(err, len, "use --algo %s (of the %s algorithms whose schedule fits, the cost "
             "model's cheapest; its schedule takes at most %.2f GiB)", best->name,
             dt_coll_name(a->kind), best_hi / GIB);
}

int dt_sim_sched_fits(dt_sim_world *w, const dt_algo *al, const dt_coll_args *a, double cap,
                      char *err, size_t len)
{
    dt_sim_entries e;
    double lo, hi;
    if (bounds(w, al, a, &e, &lo, &hi) || lo <= cap) return 0;
    int n = snprintf(err, len, "the schedule of %s %s over %d ranks takes at least %.1f GiB "
                     "(%.0f steps), more than the simulator's %.0f GiB; ",
                     dt_coll_name(a->kind), al->name, w->ranks, lo / GIB, e.steps, cap / GIB);
    if (n > 0 && (size_t)n < len) dt_sim_sched_suggest(w, al, a, cap, err + n, len - (size_t)n);
    return -1;
}
