/*
 * The simulated DDP step (sim/layout.h with tp = cp = pp = 1, no ZeRO:
 * data parallelism alone, DDP's buckets) against its two limits, on GPT-2
 * small's layout at 16 ranks:
 *  - a network a million times faster than compute: the step is the
 *    compute alone (forward + backward + optimizer) and nothing is exposed;
 *  - compute a million times faster than the network, one rank per host
 *    (no link shared, so each all-reduce takes what the cost model
 *    predicts): the step is the buckets' all-reduces one after another,
 *    the sum of their predictions;
 *  - in between, the step is at least each of the two and at most their
 *    sum, and compute + exposed + idle adds up to the step on every rank.
 */
#include <math.h>
#include <stdio.h>

#include "check.h" /* tests/check.h */
#include "sim/layout.h"

static dt_sim_layout run(double flops, double GBps, int per_host)
{
    dt_cost_model m;
    dt_cost_model_defaults(&m);
    for (int k = 0; k < DT_LINK_KINDS; k++)
        m.link[k] = (dt_link_cost){1e-6, 1.0 / (GBps * 1e9), 1.0 / (GBps * 1e9)};
    dt_sim_world w;
    char err[512];
    dt_sim_layout out = {0};
    if (dt_sim_world_init(&w, 16, per_host, &m, err, sizeof err)) {
        CHECK(0, "world: %s", err);
        return out;
    }
    dt_sim_layout_opts o = {.cfg = {12, 12, 768, 50257, 1024}, .seq = 1024, .tp = 1, .cp = 1,
                            .pp = 1, .V = 1, .micro = 4, .accum = 1, .sched = DT_PP_1F1B,
                            .flops_per_s = flops, .mem_GBps = 1e6, .bucket_bytes = 25u << 20,
                            .nics = 1};
    CHECK(dt_sim_layout_check(&o, 16, err, sizeof err) == 0 &&
              dt_sim_layout_run(&w, &o, NULL, NULL, &out, err, sizeof err) == 0,
          "ddp: %s", err);
    dt_sim_world_free(&w);
    return out;
}

static void check_split(const dt_sim_layout *d)
{
    double sum = d->slowest.compute + d->slowest.exposed + d->slowest.idle;
    CHECK(fabs(sum - d->step_s) <= 1e-9 * d->step_s, "compute %.6g + exposed %.6g + idle %.6g "
          "!= step %.6g", d->slowest.compute, d->slowest.exposed, d->slowest.idle, d->step_s);
}

int main(void)
{
    dt_sim_layout fast_net = run(1e12, 1e9, 4);
    double compute = fast_net.fwd_s + fast_net.bwd_s + fast_net.optimizer_s;
    CHECK(fast_net.dp_colls > 4, "%d buckets", fast_net.dp_colls);
    CHECK(fabs(fast_net.step_s - compute) <= 1e-3 * compute, "fast network: step %.6g s, "
          "compute %.6g s", fast_net.step_s, compute);
    check_split(&fast_net);

    dt_sim_layout fast_compute = run(1e24, 1.0, 1);
    CHECK(fabs(fast_compute.step_s - fast_compute.dp_predicted_s) <=
              1e-3 * fast_compute.dp_predicted_s,
          "fast compute: step %.6g s, all-reduces predicted %.6g s", fast_compute.step_s,
          fast_compute.dp_predicted_s);
    check_split(&fast_compute);

    dt_sim_layout mid = run(1e13, 20.0, 4);
    double c = mid.fwd_s + mid.bwd_s + mid.optimizer_s;
    CHECK(mid.step_s >= c && mid.step_s >= mid.dp_predicted_s * 0.999 &&
              mid.step_s <= (c + mid.dp_predicted_s) * 1.001,
          "between: step %.6g s, compute %.6g s, all-reduces %.6g s", mid.step_s, c,
          mid.dp_predicted_s);
    check_split(&mid);
    printf("16 ranks, GPT-2 small: step %.3f ms (compute %.3f ms, all-reduces %.3f ms "
           "predicted, %s)\n", mid.step_s * 1e3, c * 1e3, mid.dp_predicted_s * 1e3, mid.algos);
    return finish("test_sim_ddp");
}
