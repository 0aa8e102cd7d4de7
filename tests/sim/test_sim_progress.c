/*
 * What a simulation tells its world's progress function (sim/world.h),
 * which `dtrain simulate` turns into lines for a person waiting:
 *  - one all-reduce at 8192 ranks: recording reports ranks recorded, up
 *    to all of them; running reports work done up to its total, which is
 *    every rank's one operation plus every byte of the recording
 *    (dt_sim_bench's sched_bytes), never going back;
 *  - a layout's step over groups (tp 2 x dp 2 x pp 2, DDP and ZeRO-1):
 *    each recording and the run end at their totals, never going back;
 *  - every phase is told it has begun and ended (done == total last).
 */
#include <stdio.h>
#include <string.h>

#include "check.h" /* tests/check.h */
#include "sim/bench.h"
#include "sim/layout.h"

typedef struct {
    char what[128];
    double done, total;
    int phases, recordings, runs;
    double run_total; /* the last run's */
} told;

static void tell(void *ctx, const char *what, double done, double total)
{
    told *t = ctx;
    if (strcmp(what, t->what)) {
        CHECK(t->phases == 0 || t->done == t->total, "'%s' left at %.0f of %.0f", t->what,
              t->done, t->total);
        snprintf(t->what, sizeof t->what, "%s", what);
        t->phases++;
        t->recordings += !strncmp(what, "recording ", 10);
        t->runs += !strcmp(what, "running the simulation");
    } else {
        CHECK(done >= t->done && total == t->total, "'%s' went from %.0f of %.0f to %.0f of %.0f",
              what, t->done, t->total, done, total);
    }
    CHECK(done >= 0 && done <= total, "'%s': %.0f of %.0f", what, done, total);
    t->done = done, t->total = total;
    if (!strcmp(what, "running the simulation")) t->run_total = total;
}

static int world(dt_sim_world *w, int p, int per_host, told *t)
{
    dt_cost_model m;
    char err[256];
    dt_cost_model_defaults(&m);
    int rc = dt_sim_world_init(w, p, per_host, &m, err, sizeof err);
    CHECK(rc == 0, "world of %d: %s", p, err);
    w->progress = (dt_sim_progress){tell, t};
    return rc;
}

static void one_collective(void)
{
    told t = {0};
    dt_sim_world w;
    dt_sim_bench b;
    char err[512];
    if (world(&w, 8192, 8, &t)) return;
    int rc = dt_sim_bench_coll(&w, 1, "allreduce", "rhd", 1 << 20, &b, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    CHECK(t.recordings == 1 && t.runs == 1 && t.phases == 2, "%d phases: %d recordings, %d runs",
          t.phases, t.recordings, t.runs);
    CHECK(t.done == t.total, "the run ended at %.0f of %.0f", t.done, t.total);
    double want = 8192 + (double)b.sched_bytes;
    CHECK(t.run_total == want, "the run's work: %.0f, want 8192 operations + %zu bytes",
          t.run_total, b.sched_bytes);
    dt_sim_world_free(&w);
}

static void layout_over_groups(int zero)
{
    told t = {0};
    dt_sim_world w;
    dt_sim_layout out;
    char err[512];
    dt_sim_layout_opts o = {.cfg = {4, 2, 64, 32, 16}, .seq = 16, .tp = 2, .cp = 1, .pp = 2,
                            .V = 1, .micro = 1, .accum = 4, .sched = DT_PP_1F1B, .zero = zero,
                            .prefetch = 1, .flops_per_s = 1e12, .mem_GBps = 100,
                            .bucket_bytes = 4096, .nics = 1};
    if (world(&w, 8, 4, &t)) return;
    int rc = dt_sim_layout_check(&o, 8, err, sizeof err);
    if (rc == 0) rc = dt_sim_layout_run(&w, &o, NULL, NULL, &out, err, sizeof err);
    CHECK(rc == 0, "ZeRO-%d: %s", zero, err);
    CHECK(t.recordings >= 2 && t.runs == 1, "ZeRO-%d: %d recordings, %d runs", zero,
          t.recordings, t.runs);
    CHECK(!strcmp(t.what, "running the simulation") && t.done == t.total && t.total > 0,
          "ZeRO-%d: last told '%s' at %.0f of %.0f", zero, t.what, t.done, t.total);
    dt_sim_world_free(&w);
}

int main(void)
{
    one_collective();
    layout_over_groups(0);
    layout_over_groups(1);
    return finish("test_sim_progress");
}
