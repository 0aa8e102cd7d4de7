/* A restarted job's failures and recoveries read from its timeline's
 * marks, and the time they cost. See trace_failures.h. */
#include "train/trace_failures.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"

#define LANE_STEP 2

static const cJSON *get(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

double dt_trace_num(const cJSON *o, const char *key, double dflt)
{
    const cJSON *v = get(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static int is(const cJSON *e, const char *key, const char *want)
{
    const cJSON *v = get(e, key);
    return cJSON_IsString(v) && strcmp(v->valuestring, want) == 0;
}

/* The failure that led to restart k, added when new; NULL out of memory. */
static dt_trace_failure *failure_of(dt_trace_failures *t, int k, int *cap)
{
    for (int i = 0; i < t->n; i++)
        if (t->f[i].restart == k) return &t->f[i];
    if (t->n == *cap) {
        int c = *cap ? 2 * *cap : 4;
        dt_trace_failure *g = realloc(t->f, (size_t)c * sizeof *g);
        if (!g) return NULL;
        t->f = g;
        *cap = c;
    }
    dt_trace_failure *f = &t->f[t->n++];
    *f = (dt_trace_failure){.restart = k, .rank = -1, .recovery_ms = -1, .from_step = -1,
                            .lost = -1, .at_ms = -1};
    return f;
}

/* A failure or recovery mark into t: 0, or -1 with a message. */
static int read_mark(dt_trace_failures *t, const cJSON *e, int i, int *cap, char *err,
                     size_t errlen)
{
    const cJSON *args = get(e, "args");
    const int recovery = is(e, "name", "recovery");
    const double ts = dt_trace_num(e, "ts", -1), dur = dt_trace_num(e, "dur", -1);
    const int k = (int)dt_trace_num(args, "restart", -1);
    if (ts < 0 || k < 1 || (recovery && dur < 0))
        return dt_strf(err, errlen, "traceEvents[%d]: a %s mark needs ts%s and args.restart "
                       "(numbers; restarts from 1)", i, recovery ? "recovery" : "failure",
                       recovery ? ", dur" : ""), -1;
    dt_trace_failure *f = failure_of(t, k, cap);
    if (!f) return dt_strf(err, errlen, "out of memory"), -1;
    if (recovery) {
        f->recovery_ms = dur * 1e-3;
        f->from_step = (int)dt_trace_num(args, "from_step", -1);
        f->lost = (int)dt_trace_num(args, "steps_lost", -1);
        if (f->at_ms < 0) f->at_ms = ts * 1e-3;
        return 0;
    }
    const cJSON *how = get(args, "how");
    f->at_ms = ts * 1e-3;
    f->rank = (int)dt_trace_num(args, "rank", -1);
    dt_strf(f->how, sizeof f->how, "%s", cJSON_IsString(how) ? how->valuestring : "failed");
    return 0;
}

static int by_restart(const void *a, const void *b)
{
    return ((const dt_trace_failure *)a)->restart - ((const dt_trace_failure *)b)->restart;
}

/* The wall time and rank 0's pace in the last attempt, from the step
 * events and the first attempt's mark. */
static void wall_and_pace(const cJSON *events, dt_trace_failures *t)
{
    double start = 0, end = 0, lo = 0, hi = 0;
    int last = -2, count = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events)
    {
        const cJSON *args = get(e, "args");
        if (is(e, "cat", "restart") && is(e, "name", "attempt") &&
            dt_trace_num(args, "attempt", -1) == 0)
            start = dt_trace_num(e, "ts", 0);
        if (!is(e, "ph", "X") || dt_trace_num(e, "tid", -1) != LANE_STEP) continue;
        const double ts = dt_trace_num(e, "ts", 0), te = ts + dt_trace_num(e, "dur", 0);
        if (te > end) end = te;
        if (dt_trace_num(e, "pid", -1) != 0) continue;
        const int a = (int)dt_trace_num(args, "attempt", -1);
        if (a < last) continue;
        if (a > last) last = a, count = 0, lo = ts, hi = te;
        count++;
        if (ts < lo) lo = ts;
        if (te > hi) hi = te;
    }
    t->wall_ms = end > start ? (end - start) * 1e-3 : 0;
    t->step_ms = count ? (hi - lo) * 1e-3 / count : 0;
}

/* The run's arithmetic (snapshots.c's dt_run_snapshots_summary). */
static void totals(dt_trace_failures *t)
{
    for (int i = 0; i < t->n; i++) {
        const dt_trace_failure *f = &t->f[i];
        if (f->recovery_ms < 0) continue;
        t->restarts++;
        t->lost += f->lost > 0 ? f->lost : 0;
        t->recovery_ms += f->recovery_ms;
        if (f->recovery_ms > t->worst_ms) t->worst_ms = f->recovery_ms;
    }
    t->lost_ms = t->recovery_ms + (double)(t->lost - t->restarts) * t->step_ms;
    if (t->lost_ms < 0) t->lost_ms = 0;
    if (t->lost_ms > t->wall_ms) t->lost_ms = t->wall_ms;
}

int dt_trace_failures_of(const cJSON *events, dt_trace_failures *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int cap = 0, i = 0, rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events)
    {
        if (rc == 0 && is(e, "cat", "restart") &&
            (is(e, "name", "failure") || is(e, "name", "recovery")))
            rc = read_mark(out, e, i, &cap, err, errlen);
        i++;
    }
    if (rc) {
        dt_trace_failures_free(out);
        return -1;
    }
    if (out->n == 0) return 0;
    qsort(out->f, (size_t)out->n, sizeof *out->f, by_restart);
    wall_and_pace(events, out);
    totals(out);
    return 0;
}

void dt_trace_failures_free(dt_trace_failures *f)
{
    free(f->f);
    memset(f, 0, sizeof *f);
}
