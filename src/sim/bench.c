/* One collective, simulated and predicted (bench.h). */
#include "sim/bench.h"

#include <stdio.h>
#include <string.h>

#include "core/timer.h"
#include "sim/coll.h"
#include "sim/engine.h"

static int run_one(dt_sim_world *w, int nics, const dt_sim_sched *s, dt_sim_bench *out,
                   char *err, size_t len)
{
    dt_sim_engine *e = dt_sim_engine_new(w, nics, 1, 1, err, len);
    if (!e) return -1;
    dt_sim_prog prog = {0};
    int id = dt_sim_engine_add_coll(e, s), rc = -1;
    if (id < 0 || dt_sim_prog_add(&prog, dt_sim_coll(id))) {
        snprintf(err, len, "out of memory");
    } else {
        for (int r = 0; r < w->ranks; r++) dt_sim_engine_program(e, r, 0, &prog);
        uint64_t t0 = dt_now_ns();
        rc = dt_sim_engine_run(e, err, len);
        out->run_s = (double)(dt_now_ns() - t0) * 1e-9;
        out->seconds = dt_sim_engine_makespan(e);
        long long changes;
        dt_sim_engine_counts(e, &out->events, &out->messages, &changes);
    }
    dt_sim_prog_free(&prog);
    dt_sim_engine_free(e);
    return rc;
}

int dt_sim_bench_coll(dt_sim_world *w, int nics, const char *kind, const char *algo,
                      size_t bytes, dt_sim_bench *out, char *err, size_t len)
{
    memset(out, 0, sizeof *out);
    dt_coll_kind k;
    if (dt_sim_coll_kind(kind, &k, err, len)) return -1;
    dt_sim_sched s;
    uint64_t t0 = dt_now_ns();
    if (dt_sim_sched_record(&s, w, k, algo, bytes, err, len)) return -1;
    out->record_s = (double)(dt_now_ns() - t0) * 1e-9;
    snprintf(out->algo, sizeof out->algo, "%s", s.algo);
    out->bytes = s.bytes;
    out->predicted = s.predicted;
    out->steps = s.steps;
    out->sched_bytes = s.start[s.size];
    int rc = run_one(w, nics, &s, out, err, len);
    dt_sim_sched_free(&s);
    return rc;
}
