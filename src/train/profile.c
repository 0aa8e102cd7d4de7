/* `dtrain train --profile` (see profile.h). A step's parts are the
 * kernels' (each adds its time, FLOPs and bytes: kernels/profile.h), the
 * data, the communication the step waited for (the strategy's exposed
 * time; with peers, split into what no rank's compute hid and the wait
 * for slower ranks), and the rest: what no part claims (the strategies'
 * own copies and casts, the model's bookkeeping, waits a strategy does not
 * count as communication). Each kernel part is set beside its roofline bound: its
 * FLOPs at this process's measured peak, or its bytes at the measured
 * copy bandwidth, whichever takes longer; "of bound" is that bound over
 * the time taken, 100% at the machine's limit. The communication that the
 * progress threads ran while the step computed is shown beside it. */
#include "train/profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "dtrain/comm.h"
#include "kernels/bandwidth.h"
#include "kernels/profile.h"
#include "train/run.h"

void dt_run_profile_start(dt_run *t)
{
    memset(&t->prof, 0, sizeof t->prof);
    t->prof.bw = dt_copy_bandwidth();
    dt_prof_part drop[DT_PROF_NKINDS];
    dt_prof_shape drop_shapes[DT_PROF_SHAPES];
    dt_prof_take(drop); /* whatever ran before the loop (an evaluation, a warm-up) */
    (void)dt_prof_take_shapes(drop_shapes);
    dt_prof_enable(1);
    t->prof.bg_mark = dt_comm_background_ns();
    t->prof.on = 1;
}

void dt_run_profile_data(dt_run *t, uint64_t ns) { t->prof.step_data_ns += ns; }

/* The JSON log's names for the parts, then the step's other four. */
static const char *const json_names[DT_PROF_NKINDS + 4] = {
    "matmul",    "attention", "norm",        "activation", "crossentropy",
    "embedding", "routing",   "optimizer",   "grad_norm",  "bias_grad",
    "data",      "comm_waited", "rest",      "comm_hidden"};

int dt_run_profile_last(const dt_run *t, const char *const **names, const double **ms)
{
    *names = json_names;
    *ms = t->prof.last;
    return t->prof.on ? DT_PROF_NKINDS + 4 : 0;
}

/* The step's parts, as the JSON log gives them. */
static void keep_last(dt_run *t, const dt_prof_part *p, double step_ms, double comm_ms,
                      double data_ms, double bg_ms)
{
    double claimed = 0;
    for (int k = 0; k < DT_PROF_NKINDS; k++) {
        t->prof.last[k] = (double)p[k].ns * 1e-6;
        claimed += t->prof.last[k];
    }
    t->prof.last[DT_PROF_NKINDS] = data_ms;
    t->prof.last[DT_PROF_NKINDS + 1] = comm_ms;
    t->prof.last[DT_PROF_NKINDS + 2] = step_ms - claimed - data_ms - comm_ms;
    t->prof.last[DT_PROF_NKINDS + 3] = bg_ms > comm_ms ? bg_ms - comm_ms : 0.0;
}

void dt_run_profile_step(dt_run *t, double step_ms, double comm_ms)
{
    dt_prof_part p[DT_PROF_NKINDS];
    dt_prof_shape shapes[DT_PROF_SHAPES];
    dt_prof_take(p);
    const int nshapes = dt_prof_take_shapes(shapes);
    const uint64_t data = t->prof.step_data_ns, bg = dt_comm_background_ns();
    const uint64_t step_bg = bg - t->prof.bg_mark;
    t->prof.step_data_ns = 0;
    t->prof.bg_mark = bg;
    keep_last(t, p, step_ms, comm_ms, (double)data * 1e-6, (double)step_bg * 1e-6);
    if (t->steps_run == 0) return; /* the first step builds the kernels */
    for (int i = 0; i < nshapes; i++)
        dt_prof_shapes_add(t->prof.shapes, &t->prof.nshapes, &shapes[i], shapes[i].ns,
                           shapes[i].flops, shapes[i].calls);
    t->prof.bg_ns += step_bg;
    for (int k = 0; k < DT_PROF_NKINDS; k++) {
        t->prof.sum[k].ns += p[k].ns;
        t->prof.sum[k].flops += p[k].flops;
        t->prof.sum[k].bytes += p[k].bytes;
        t->prof.sum[k].calls += p[k].calls;
    }
    t->prof.step_ms += step_ms;
    t->prof.comm_ms += comm_ms;
    t->prof.data_ns += data;
    t->prof.steps++;
}

static void row(FILE *out, const char *name, double ms, double step_ms)
{
    fprintf(out, "  %-24s %9.2f %6.1f%%\n", name, ms, 100.0 * ms / step_ms);
}

/* A kernel part's line: its time, FLOPs, bytes, bound and what bounds it. */
static void kernel_row(FILE *out, const dt_run *t, int k, double n, double step_ms)
{
    const dt_prof_part *p = &t->prof.sum[k];
    if (p->calls == 0) return;
    const double ms = (double)p->ns * 1e-6 / n, flops = p->flops / n, bytes = p->bytes / n;
    const double by_flops = t->rank_peak > 0 ? flops / t->rank_peak * 1e3 : 0;
    const double by_bytes = t->prof.bw > 0 ? bytes / t->prof.bw * 1e3 : 0;
    const double bound = by_flops > by_bytes ? by_flops : by_bytes;
    fprintf(out, "  %-24s %9.2f %6.1f%% %9.2f %8.3f %9.2f  %-7s %6.1f%%\n", dt_prof_name(k), ms,
            100.0 * ms / step_ms, flops * 1e-9, bytes * 1e-9, bound,
            by_flops > by_bytes ? "compute" : "memory", ms > 0 ? 100.0 * bound / ms : 0.0);
}

static int more_time_first(const void *a, const void *b)
{
    const uint64_t x = ((const dt_prof_shape *)a)->ns, y = ((const dt_prof_shape *)b)->ns;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The matrix products again, by shape and path, the most time first: the
 * shapes that lose the time, each at its share of the peak. */
static void shapes_report(FILE *out, dt_run *t, double n)
{
    if (t->prof.nshapes == 0) return;
    qsort(t->prof.shapes, (size_t)t->prof.nshapes, sizeof t->prof.shapes[0], more_time_first);
    fprintf(out, "  matrix products by shape, per step (C[M, N] = op(A)[M, K] op(B)[K, N]):\n");
    fprintf(out, "  %7s %7s %7s  %-7s %-12s %6s %9s %9s %8s\n", "M", "N", "K", "op", "path",
            "calls", "ms", "GFLOP", "of peak");
    for (int i = 0; i < t->prof.nshapes; i++) {
        const dt_prof_shape *p = &t->prof.shapes[i];
        static const char *const ops[4] = {"A B", "A B^T", "A^T B", "A^T B^T"};
        const double ms = (double)p->ns * 1e-6 / n, gflop = p->flops * 1e-9 / n;
        const double rate = p->ns ? p->flops / ((double)p->ns * 1e-9) : 0;
        if (p->M == 0)
            fprintf(out, "  %-23s  %-7s %-12s", "(other shapes)", "", "");
        else
            fprintf(out, "  %7d %7d %7d  %-7s %-12s", p->M, p->N, p->K,
                    ops[2 * p->transA + p->transB], p->path);
        fprintf(out, " %6.4g %9.2f %9.3f %7.1f%%\n", (double)p->calls / n, ms, gflop,
                t->rank_peak > 0 ? 100.0 * rate / t->rank_peak : 0.0);
    }
}

void dt_run_profile_report(dt_run *t)
{
    dt_prof_enable(0);
    if (!t->prof.on || t->r.rank != 0) return;
    FILE *out = t->out;
    if (t->prof.steps == 0) {
        fprintf(out, "profile: no step after the first, which builds the kernels, to profile "
                "(run 2 steps or more)\n");
        return;
    }
    const double n = (double)t->prof.steps, step = t->prof.step_ms / n;
    fprintf(out, "profile of rank 0, per step (the mean of %ld steps after the first: %.2f ms a "
            "step); FLOPs and bytes counted from the shapes; bounds at this process's share of "
            "the peak MFU is measured against, %.1f GFLOP/s, and at %.1f GB/s, what its %d "
            "thread%s copy (bytes read and written; over 100%% of a memory bound: the data came "
            "from the caches)\n", t->prof.steps, step, t->rank_peak * 1e-9, t->prof.bw * 1e-9,
            t->threads, t->threads == 1 ? "" : "s");
    fprintf(out, "  %-24s %9s %7s %9s %8s %9s  %-7s %7s\n", "part", "ms", "share", "GFLOP",
            "GB", "bound ms", "bound", "of bound");
    double claimed = 0;
    for (int k = 0; k < DT_PROF_NKINDS; k++) {
        kernel_row(out, t, k, n, step);
        claimed += (double)t->prof.sum[k].ns * 1e-6 / n;
    }
    const double data = (double)t->prof.data_ns * 1e-6 / n, comm = t->prof.comm_ms / n;
    row(out, "data", data, step);
    row(out, "communication waited on", comm, step);
    if (t->waits.steps > 0) {
        /* The rank that computed longest waited least: what it waited is
         * communication no compute hid; the rest of this rank's wait was
         * for that rank. The same steps as the table's (after the first). */
        const double exposed = t->waits.exposed_ms / (double)t->waits.steps;
        fprintf(out, "    %-22s %9.2f %6.1f%%   (the least any rank waited: communication that "
                "compute did not hide)\n", "exposed", exposed, 100.0 * exposed / step);
        fprintf(out, "    %-22s %9.2f %6.1f%%   (this rank's wait for slower ranks' compute)\n",
                "behind slower ranks", comm - exposed, 100.0 * (comm - exposed) / step);
    }
    row(out, "the rest", step - claimed - data - comm, step);
    /* Beside the step, not in its sum: what the progress threads ran while
     * the step computed (their whole time less what the step waited for). */
    const double bg = (double)t->prof.bg_ns * 1e-6 / n;
    fprintf(out, "  %-24s %9.2f %6.1f%%   (beside the step: the progress threads' %.2f ms of "
            "communication less the %.2f ms waited on)\n", "communication hidden",
            bg > comm ? bg - comm : 0.0, 100.0 * (bg > comm ? bg - comm : 0.0) / step, bg, comm);
    shapes_report(out, t, n);
}
