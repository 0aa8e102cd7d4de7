/*
 * Collectives recorded from the real algorithms (sim/coll.h) and played
 * by the engine, against closed forms written here:
 *  - ring all-reduce of n bytes at p = 2..8 ranks on one host takes
 *    2 (p-1) (alpha + beta n/p) + (p-1) gamma n/p, to 1e-9;
 *  - with no contention possible (one rank per host and a NIC each), the
 *    simulated time of rhd equals the cost model's prediction;
 *  - the recording holds the ring's 2 (p-1) steps per rank, to its
 *    neighbours, in a few bytes each;
 *  - large all-reduces round a ring take roughly the same time from 16 to
 *    1024 ranks (the bandwidth term 2 (p-1)/p n beta; within 25%);
 *  - small all-reduces: tree's and rhd's times grow as log p (less than
 *    twice as fast as lg p from 8 to 512 ranks: tree's broadcast sends to
 *    all its children at once, so they share its port) and ring's as p,
 *    so ring / rhd grows with p (8, 64, 512 ranks).
 * Times of the simulator itself are printed, never asserted.
 */
#include <math.h>
#include <stdio.h>

#include "check.h" /* tests/check.h */
#include "sim/bench.h"
#include "sim/coll.h"

static const double ALPHA = 1e-6, BETA = 1.0 / 10e9, GAMMA = 1.0 / 5e9;

static int world(dt_sim_world *w, int p, int per_host)
{
    dt_cost_model m;
    char err[256];
    dt_cost_model_defaults(&m);
    m.link[DT_LINK_SHM] = (dt_link_cost){ALPHA, BETA, GAMMA};
    m.link[DT_LINK_TCP] = (dt_link_cost){20 * ALPHA, 10 * BETA, GAMMA};
    int rc = dt_sim_world_init(w, p, per_host, &m, err, sizeof err);
    CHECK(rc == 0, "world of %d: %s", p, err);
    return rc;
}

static double simulate(int p, int per_host, const char *kind, const char *algo, size_t bytes,
                       dt_sim_bench *b)
{
    dt_sim_world w;
    char err[512];
    if (world(&w, p, per_host)) return -1;
    int rc = dt_sim_bench_coll(&w, 1, kind, algo, bytes, b, err, sizeof err);
    CHECK(rc == 0, "%s %s at %d ranks: %s", kind, algo, p, err);
    dt_sim_world_free(&w);
    return rc ? -1 : b->seconds;
}

static void ring_closed_form(void)
{
    const size_t n = 840 * 4096; /* bytes; 840 = lcm(2..8): whole blocks at every p */
    for (int p = 2; p <= 8; p++) {
        dt_sim_bench b;
        double t = simulate(p, p, "allreduce", "ring", n, &b);
        double blk = (double)n / p;
        double want = 2 * (p - 1) * (ALPHA + BETA * blk) + (p - 1) * GAMMA * blk;
        CHECK(fabs(t - want) <= 1e-9 * want, "ring at %d: %.9g s, want %.9g", p, t, want);
        CHECK(fabs(b.predicted - want) <= 1e-9 * want, "ring at %d: predicted %.9g s, want %.9g",
              p, b.predicted, want);
        CHECK(b.steps == (size_t)(2 * (p - 1) * p), "ring at %d: %zu steps recorded", p, b.steps);
    }
}

static void rhd_equals_prediction(void)
{
    dt_sim_bench b;
    double t = simulate(16, 1, "allreduce", "rhd", 1 << 20, &b);
    CHECK(fabs(t - b.predicted) <= 1e-9 * t, "rhd at 16 hosts: simulated %.9g, predicted %.9g",
          t, b.predicted);
}

static void ring_flat_in_p(void)
{
    const size_t n = 256u << 20;
    double t16 = 0;
    for (int p = 16; p <= 1024; p *= 4) {
        dt_sim_bench b;
        double t = simulate(p, p, "allreduce", "ring", n, &b);
        if (p == 16) t16 = t;
        printf("ring 256 MiB at %4d ranks: %.4f s simulated (%.2f s recording %zu KiB, %.2f s "
               "running %lld messages)\n", p, t, b.record_s, b.sched_bytes >> 10, b.run_s,
               b.messages);
        CHECK(t >= t16 * 0.99 && t <= t16 * 1.25, "ring at %d: %.4f s against %.4f s at 16", p, t,
              t16);
    }
}

static void latency_log_vs_linear(void)
{
    double last = 0, rhd8 = 0, tree8 = 0;
    for (int p = 8; p <= 512; p *= 8) {
        dt_sim_bench b;
        double ring = simulate(p, p, "allreduce", "ring", (size_t)p * 4, &b);
        double rhd = simulate(p, p, "allreduce", "rhd", (size_t)p * 4, &b);
        double tree = simulate(p, p, "allreduce", "tree", (size_t)p * 4, &b);
        double lg = log2(p);
        printf("small all-reduce at %3d ranks: ring %.2f us, rhd %.2f us, tree %.2f us\n", p,
               ring * 1e6, rhd * 1e6, tree * 1e6);
        if (p == 8) rhd8 = rhd, tree8 = tree;
        CHECK(rhd / rhd8 < 2 * lg / 3 && tree / tree8 < 2 * lg / 3,
              "rhd %.3g, tree %.3g s at %d ranks: faster than log p from %.3g, %.3g at 8", rhd,
              tree, p, rhd8, tree8);
        CHECK(ring / rhd > last, "ring / rhd %.3g at %d ranks, not above %.3g", ring / rhd, p,
              last);
        last = ring / rhd;
    }
}

int main(void)
{
    ring_closed_form();
    rhd_equals_prediction();
    ring_flat_in_p();
    latency_log_vs_linear();
    return finish("test_sim_coll");
}
