/* A pipeline schedule's figures from lists of a bounded length
 * (plan/pp_figures.h), against the whole lists:
 *  - every kind (interleaved at V 2 and 3) at p 2, 3, 5 and 8, at each M
 *    from 4 p + 1 to 7 p that the kind takes, with the chart's costs (F 1,
 *    B 2, I = W = 1) and with a backward of 2.37 forwards: the makespan
 *    and the idle fraction within 1e-9 of the whole lists' simulation, the
 *    slots of every rank equal to the executor's count over the whole
 *    list (dt_pp_exec_slots), and the figures say they were extended;
 *  - at M up to 4 p the whole lists are simulated (nothing extended);
 *  - zb1p at p 64 and M 2^20 in well under a second, against ZB-H1's
 *    closed form with F = I = W: every rank busy 3 M units and idle p - 1,
 *    so the makespan is 3 M + p - 1, and p micro-batches held until their
 *    W on every rank;
 *  - what a run refuses is refused: interleaved with M not a multiple of
 *    p, more than 2^20 micro-batch chunks, more than 64 chunks a rank. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "parallel/pipeline/executor.h"
#include "plan/pp_figures.h"

/* The figures of the whole lists, worked out here. */
static int whole(dt_pp_kind kind, int p, int V, int M, const double cost[4], double *makespan,
                 double *idle, int *slots)
{
    dt_pp_schedule s;
    dt_pp_sim sim;
    char err[512];
    if (dt_pp_schedule_build(&s, kind, p, V, M, err, sizeof err) ||
        dt_pp_schedule_simulate(&s, cost, &sim, err, sizeof err)) {
        CHECK(0, "%s", err);
        return -1;
    }
    *makespan = sim.makespan, *idle = sim.idle_fraction;
    int *cut = calloc((size_t)p * V + 1, sizeof *cut), cap = V * M + 1;
    dt_gpt_part *parts = malloc((size_t)cap * sizeof *parts);
    for (int r = 0; r < p; r++) slots[r] = dt_pp_exec_slots(&s, r, cut, parts, cap);
    free(cut), free(parts);
    dt_pp_sim_free(&sim);
    dt_pp_schedule_free(&s);
    return 0;
}

static void compare(dt_pp_kind kind, int p, int V, int M, const double cost[4])
{
    dt_plan_pp_figures g;
    char err[512];
    double makespan, idle;
    int slots[64];
    check_set_label("%s p %d V %d M %d B %g: ", dt_pp_kind_name(kind), p, V, M, cost[1]);
    if (whole(kind, p, V, M, cost, &makespan, &idle, slots)) return;
    CHECK(dt_plan_pp_figures_of(kind, p, V, M, cost, &g, err, sizeof err) == 0, "%s", err);
    CHECK(fabs(g.makespan - makespan) <= 1e-9 * makespan, "makespan %.12g, whole %.12g",
          g.makespan, makespan);
    CHECK(fabs(g.idle_fraction - idle) <= 1e-9, "idle %.12g, whole %.12g", g.idle_fraction, idle);
    for (int r = 0; r < p; r++)
        CHECK(g.slots[r] == slots[r], "rank %d: %d slots, the whole list %d", r, g.slots[r],
              slots[r]);
    CHECK((g.from != 0) == (M > DT_PLAN_PP_WHOLE(p)), "extended from %d", g.from);
}

static void against_whole(void)
{
    static const dt_pp_kind kinds[] = {DT_PP_NAIVE, DT_PP_GPIPE, DT_PP_1F1B, DT_PP_ZB1P,
                                       DT_PP_INTERLEAVED, DT_PP_INTERLEAVED};
    static const int Vs[] = {1, 1, 1, 1, 2, 3};
    static const int ps[] = {2, 3, 5, 8};
    const double skew[4] = {1, 2.37, 1.185, 1.185};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
            const int p = ps[i], step = kinds[k] == DT_PP_INTERLEAVED ? p : 1;
            for (int M = step; M <= 7 * p; M += step) {
                if (M <= 4 * p && M % 3) continue; /* the whole lists: a few suffice */
                compare(kinds[k], p, Vs[k], M, dt_pp_chart_cost);
                compare(kinds[k], p, Vs[k], M, skew);
            }
        }
    check_set_label("%s", "");
}

static void long_step(void)
{
    const int p = 64, M = 1 << 20;
    dt_plan_pp_figures g;
    char err[512];
    clock_t t0 = clock();
    CHECK(dt_plan_pp_figures_of(DT_PP_ZB1P, p, 1, M, dt_pp_chart_cost, &g, err, sizeof err) == 0,
          "%s", err);
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK(s < 2, "%.2f s of CPU for 2^20 micro-batches", s);
    CHECK(g.makespan == 3.0 * M + p - 1, "makespan %.17g, ZB-H1's 3 M + p - 1 = %d", g.makespan,
          3 * M + p - 1);
    const double idle = (p - 1.0) / (3.0 * M + p - 1);
    CHECK(fabs(g.idle_fraction - idle) <= 1e-15, "idle %.17g, (p-1)/(3M+p-1) = %.17g",
          g.idle_fraction, idle);
    for (int r = 0; r < p; r++) CHECK(g.slots[r] == p, "rank %d holds %d, not p", r, g.slots[r]);
}

static void refusals(void)
{
    dt_plan_pp_figures g;
    char err[512];
    CHECK_ERR(dt_plan_pp_figures_of(DT_PP_INTERLEAVED, 4, 2, 6, dt_pp_chart_cost, &g, err,
                                    sizeof err), err, "multiple of 4");
    CHECK_ERR(dt_plan_pp_figures_of(DT_PP_INTERLEAVED, 4, 2, 1 << 20, dt_pp_chart_cost, &g, err,
                                    sizeof err), err, "2^20");
    CHECK_ERR(dt_plan_pp_figures_of(DT_PP_INTERLEAVED, 2, 65, 4, dt_pp_chart_cost, &g, err,
                                    sizeof err), err, "65 chunks", "1..64");
}

int main(void)
{
    against_whole();
    long_step();
    refusals();
    return finish("test_pp_figures");
}
