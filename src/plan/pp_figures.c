/* A schedule's figures at any micro-batch count from lists of a bounded
 * count. See pp_figures.h. */
#include "plan/pp_figures.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "parallel/pipeline/executor.h"

/* What one count of micro-batches gives: the step, the compute of all the
 * ranks together, each rank's slots. */
typedef struct {
    double makespan, busy;
    int slots[64];
} point;

/* The executor's slots of every rank's list. The parts' layers play no
 * part in the count, so every cut is 0. */
static int slots_of(const dt_pp_schedule *s, int *slots)
{
    const int cap = s->V * s->M + 1;
    int *cut = calloc((size_t)s->p * s->V + 1, sizeof *cut);
    dt_gpt_part *parts = malloc((size_t)cap * sizeof *parts);
    int rc = cut && parts ? 0 : -1;
    for (int r = 0; rc == 0 && r < s->p; r++)
        rc = (slots[r] = dt_pp_exec_slots(s, r, cut, parts, cap)) < 0 ? -1 : 0;
    free(cut);
    free(parts);
    return rc;
}

/* Lists built (s) simulated at cost[]: the step and the ranks' compute,
 * and with `slots` each rank's slots. */
static int measure(const dt_pp_schedule *s, const double cost[4], int slots, point *at,
                   char *err, size_t errlen)
{
    dt_pp_sim sim;
    memset(at, 0, sizeof *at);
    if (dt_pp_schedule_simulate(s, cost, &sim, err, errlen)) return -1;
    at->makespan = sim.makespan;
    for (int r = 0; r < s->p; r++) at->busy += sim.busy[r];
    dt_pp_sim_free(&sim);
    if (slots && slots_of(s, at->slots))
        return dt_strf(err, errlen, "pipeline schedule %s: out of memory counting its slots",
                       dt_pp_kind_name(s->kind)), -1;
    return 0;
}

/* The whole lists of M micro-batches, built, checked and simulated. */
static int whole(dt_pp_kind kind, int p, int V, int M, const double cost[4], point *at,
                 char *err, size_t errlen)
{
    dt_pp_schedule s;
    if (dt_pp_schedule_build(&s, kind, p, V, M, err, errlen)) return -1;
    int rc = measure(&s, cost, 1, at, err, errlen);
    dt_pp_schedule_free(&s);
    return rc;
}

static int same(double x, double y) { return fabs(x - y) <= 1e-9 * fmax(fabs(x), fabs(y)); }

/* Whether a, b and c, one step apart, differ by the same amounts. */
static int repeats(const point *a, const point *b, const point *c, int p)
{
    int ok = same(c->makespan - b->makespan, b->makespan - a->makespan) &&
             same(c->busy - b->busy, b->busy - a->busy);
    for (int r = 0; ok && r < p; r++) ok = c->slots[r] - b->slots[r] == b->slots[r] - a->slots[r];
    return ok;
}

static void figures(const point *at, int p, int from, dt_plan_pp_figures *out)
{
    out->makespan = at->makespan;
    out->idle_fraction = at->makespan > 0 ? 1 - at->busy / (p * at->makespan) : 0;
    memcpy(out->slots, at->slots, sizeof out->slots);
    out->from = from;
}

/* The figures at count M: simulated, on lists `lists` hands out (NULL:
 * built here), with each rank's slots when `slots`. */
static int at_count(dt_pp_kind kind, int p, int V, int M, const double cost[4],
                    dt_plan_pp_lists lists, void *ctx, int slots, point *at, char *err,
                    size_t errlen)
{
    if (!lists) return whole(kind, p, V, M, cost, at, err, errlen);
    const dt_pp_schedule *s = lists(ctx, M, err, errlen);
    return s ? measure(s, cost, slots, at, err, errlen) : -1;
}

/* The figures of the whole step of M, and the count they extend (0: M's
 * own). */
static int step_point(dt_pp_kind kind, int p, int V, int M, const double cost[4],
                      dt_plan_pp_lists lists, void *ctx, int slots, point *m, int *from,
                      char *err, size_t errlen)
{
    if (dt_pp_schedule_valid(kind, p, V, M, err, errlen)) return -1;
    if (V > 64)
        return dt_strf(err, errlen, "pipeline schedule %s: %d chunks a rank; a run holds at "
                       "most 64 (--pp-virtual 1..64)", dt_pp_kind_name(kind), V), -1;
    point a, b, c;
    *from = 0;
    if (M <= DT_PLAN_PP_WHOLE(p)) return at_count(kind, p, V, M, cost, lists, ctx, slots, m, err,
                                                 errlen);
    /* interleaved takes micro-batches p at a time (M is a multiple of p) */
    const int step = kind == DT_PP_INTERLEAVED ? p : 1, base = 2 * p;
    if (at_count(kind, p, V, base, cost, lists, ctx, slots, &a, err, errlen) ||
        at_count(kind, p, V, base + step, cost, lists, ctx, slots, &b, err, errlen) ||
        at_count(kind, p, V, base + 2 * step, cost, lists, ctx, slots, &c, err, errlen))
        return -1;
    if (!repeats(&a, &b, &c, p))
        return dt_strf(err, errlen, "pipeline schedule %s (p %d, V %d): its figures do not "
                       "grow evenly from %d micro-batches on, so those of %d cannot be "
                       "extended from them (a schedule the planner does not know)",
                       dt_pp_kind_name(kind), p, V, base, M), -1;
    const int k = (M - base) / step;
    *m = (point){a.makespan + k * (b.makespan - a.makespan), a.busy + k * (b.busy - a.busy),
                 {0}};
    for (int r = 0; r < p; r++) m->slots[r] = a.slots[r] + k * (b.slots[r] - a.slots[r]);
    *from = base;
    return 0;
}

int dt_plan_pp_figures_of(dt_pp_kind kind, int p, int V, int M, const double cost[4],
                          dt_plan_pp_figures *out, char *err, size_t errlen)
{
    point m;
    int from;
    memset(out, 0, sizeof *out);
    if (step_point(kind, p, V, M, cost, NULL, NULL, 1, &m, &from, err, errlen)) return -1;
    figures(&m, p, from, out);
    return 0;
}

int dt_plan_pp_makespan(dt_pp_kind kind, int p, int V, int M, const double cost[4],
                        dt_plan_pp_lists lists, void *ctx, double *makespan, char *err,
                        size_t errlen)
{
    point m;
    int from;
    if (step_point(kind, p, V, M, cost, lists, ctx, 0, &m, &from, err, errlen)) return -1;
    *makespan = m.makespan;
    return 0;
}
