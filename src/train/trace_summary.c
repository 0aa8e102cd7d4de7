/* Busy, communication and idle fractions from a timeline: the events read
 * into intervals per rank and lane, then unions, intersections and lengths
 * of sorted interval lists. See trace_summary.h. */
#include "train/trace_summary.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/str.h"
#include "train/trace_failures.h"

#define LANES 3 /* compute, comm, step: the tids of core/trace.h */
#define LANE_STEP 2

typedef struct {
    double lo, hi; /* microseconds */
    int step;      /* step events: args.step; else -1 */
} ival;

typedef struct {
    ival *v;
    size_t n, cap;
} ivals;

typedef struct {
    int pid;
    ivals lane[LANES];
} rank_ivals;

typedef struct {
    rank_ivals *r;
    int n, cap;
} trace_ivals;

/* ---- intervals ---------------------------------------------------------------- */

static int push(ivals *l, ival x)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        ival *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return 0;
}

static int by_lo(const void *a, const void *b)
{
    double x = ((const ival *)a)->lo, y = ((const ival *)b)->lo;
    return (x > y) - (x < y);
}

/* In place: sorted, overlapping or touching intervals merged. */
static void make_union(ivals *l)
{
    if (l->n == 0) return;
    qsort(l->v, l->n, sizeof *l->v, by_lo);
    size_t k = 0;
    for (size_t i = 1; i < l->n; i++) {
        if (l->v[i].lo <= l->v[k].hi) {
            if (l->v[i].hi > l->v[k].hi) l->v[k].hi = l->v[i].hi;
        } else {
            l->v[++k] = l->v[i];
        }
    }
    l->n = k + 1;
}

/* a ∩ b of two unions (sorted, disjoint), itself one. */
static int intersect(const ivals *a, const ivals *b, ivals *out)
{
    size_t i = 0, j = 0;
    while (i < a->n && j < b->n) {
        double lo = a->v[i].lo > b->v[j].lo ? a->v[i].lo : b->v[j].lo;
        double hi = a->v[i].hi < b->v[j].hi ? a->v[i].hi : b->v[j].hi;
        if (lo < hi && push(out, (ival){lo, hi, -1})) return -1;
        if (a->v[i].hi < b->v[j].hi)
            i++;
        else
            j++;
    }
    return 0;
}

static double length(const ivals *l)
{
    double s = 0;
    for (size_t i = 0; i < l->n; i++) s += l->v[i].hi - l->v[i].lo;
    return s;
}

/* ---- reading the events --------------------------------------------------------- */

static rank_ivals *rank_of(trace_ivals *t, int pid)
{
    for (int i = 0; i < t->n; i++)
        if (t->r[i].pid == pid) return &t->r[i];
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 8;
        rank_ivals *r = realloc(t->r, (size_t)cap * sizeof *r);
        if (!r) return NULL;
        t->r = r;
        t->cap = cap;
    }
    memset(&t->r[t->n], 0, sizeof t->r[t->n]);
    t->r[t->n].pid = pid;
    return &t->r[t->n++];
}

static void trace_free(trace_ivals *t)
{
    for (int i = 0; i < t->n; i++)
        for (int l = 0; l < LANES; l++) free(t->r[i].lane[l].v);
    free(t->r);
}

/* One element of traceEvents: complete events ("X") of the three lanes
 * become intervals (1), a process_name names a rank that may have none,
 * anything else is skipped (0); -1 on an error (err empty: out of memory). */
static int read_event(trace_ivals *t, const cJSON *e, int i, char *err, size_t errlen)
{
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
    if (!cJSON_IsString(ph)) return 0;
    double pid = dt_trace_num(e, "pid", -1), tid = dt_trace_num(e, "tid", -1);
    if (strcmp(ph->valuestring, "M") == 0 && pid >= 0) return rank_of(t, (int)pid) ? 0 : -1;
    if (strcmp(ph->valuestring, "X") != 0 || tid < 0 || tid >= LANES) return 0;
    double ts = dt_trace_num(e, "ts", -1), dur = dt_trace_num(e, "dur", -1);
    if (pid < 0 || ts < 0 || dur < 0)
        return dt_strf(err, errlen, "traceEvents[%d]: a complete event needs a pid, ts and dur "
                                    "(numbers, not negative)", i), -1;
    ival x = {ts, ts + dur, -1};
    if ((int)tid == LANE_STEP) {
        x.step = (int)dt_trace_num(cJSON_GetObjectItemCaseSensitive(e, "args"), "step", -1);
        if (x.step < 0)
            return dt_strf(err, errlen, "traceEvents[%d]: a step event (tid 2) without "
                                        "args.step", i), -1;
    }
    rank_ivals *r = rank_of(t, (int)pid);
    return r && push(&r->lane[(int)tid], x) == 0 ? 1 : -1;
}

static const cJSON *events_of(const cJSON *root)
{
    if (cJSON_IsArray(root)) return root; /* the format's bare-array form */
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    return cJSON_IsArray(ev) ? ev : NULL;
}

static int read_trace(const char *json, trace_ivals *t, dt_trace_failures *f, char *err,
                      size_t errlen)
{
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return dt_strf(err, errlen, "not valid JSON (near byte %ld): is it a file that "
                                    "--trace wrote?", at ? (long)(at - json) : 0L), -1;
    }
    const cJSON *ev = events_of(root), *e;
    int rc = ev ? 0 : (dt_strf(err, errlen, "no traceEvents array: not a Trace Event file"), -1);
    int i = 0, complete = 0;
    cJSON_ArrayForEach(e, ev)
    {
        int got = rc == 0 ? read_event(t, e, i++, err, errlen) : 0;
        if (got < 0) rc = -1;
        complete += got > 0;
    }
    if (rc == 0) rc = dt_trace_failures_of(ev, f, err, errlen);
    cJSON_Delete(root);
    if (rc && !err[0]) dt_strf(err, errlen, "out of memory reading the events");
    if (rc == 0 && complete == 0)
        rc = (dt_strf(err, errlen, "no events: the trace holds no complete events "
                                   "(\"ph\":\"X\") on tids 0-2"), -1);
    return rc;
}

/* ---- the fractions ---------------------------------------------------------------- */

static int by_pid(const void *a, const void *b)
{
    return ((const rank_ivals *)a)->pid - ((const rank_ivals *)b)->pid;
}

/* The trace's first and last step; 0 when it has none. */
static int step_range(const trace_ivals *t, int *first, int *last)
{
    int any = 0;
    for (int i = 0; i < t->n; i++)
        for (size_t k = 0; k < t->r[i].lane[LANE_STEP].n; k++) {
            int s = t->r[i].lane[LANE_STEP].v[k].step;
            if (!any || s < *first) *first = s;
            if (!any || s > *last) *last = s;
            any = 1;
        }
    return any;
}

/* One rank's fractions over its steps >= from. */
static int rank_stats(rank_ivals *r, int from, dt_trace_rank_stats *out)
{
    ivals win = {0}, busy = {0}, comm = {0}, hidden = {0};
    memset(out, 0, sizeof *out);
    out->rank = r->pid;
    int rc = 0;
    for (size_t k = 0; k < r->lane[LANE_STEP].n && rc == 0; k++)
        if (r->lane[LANE_STEP].v[k].step >= from) {
            rc = push(&win, r->lane[LANE_STEP].v[k]);
            out->steps++;
        }
    make_union(&win);
    make_union(&r->lane[0]);
    make_union(&r->lane[1]);
    if (rc == 0) rc = intersect(&r->lane[0], &win, &busy);
    if (rc == 0) rc = intersect(&r->lane[1], &win, &comm);
    if (rc == 0) rc = intersect(&comm, &busy, &hidden);
    double w = length(&win);
    if (rc == 0 && w > 0) {
        out->window_ms = w * 1e-3;
        out->busy = length(&busy) / w;
        out->comm = (length(&comm) - length(&hidden)) / w;
        out->idle = (w - length(&busy) - (length(&comm) - length(&hidden))) / w;
    }
    free(win.v);
    free(busy.v);
    free(comm.v);
    free(hidden.v);
    return rc;
}

static void job_means(dt_trace_summary *s)
{
    dt_trace_rank_stats *j = &s->job;
    memset(j, 0, sizeof *j);
    j->rank = -1;
    for (int i = 0; i < s->nranks; i++) {
        const dt_trace_rank_stats *r = &s->rank[i];
        if (r->window_ms <= 0) continue;
        j->steps++;
        j->window_ms += r->window_ms;
        j->busy += r->busy;
        j->comm += r->comm;
        j->idle += r->idle;
    }
    if (j->steps == 0) return;
    j->window_ms /= j->steps;
    j->busy /= j->steps;
    j->comm /= j->steps;
    j->idle /= j->steps;
}

static int choose_from(const trace_ivals *t, int from, dt_trace_summary *s, char *err,
                       size_t errlen)
{
    if (!step_range(t, &s->first_step, &s->last_step))
        return dt_strf(err, errlen, "no \"step\" events (tid 2, args.step): write the trace "
                                    "with `dtrain train --trace FILE`"), -1;
    if (from < 0) from = s->last_step > s->first_step ? s->first_step + 1 : s->first_step;
    if (from > s->last_step)
        return dt_strf(err, errlen, "--from-step %d: the trace's steps are %d..%d; give one "
                                    "of them", from, s->first_step, s->last_step), -1;
    s->from_step = from;
    return 0;
}

int dt_trace_summarize(const char *json, int from_step, dt_trace_summary *s, char *err,
                       size_t errlen)
{
    trace_ivals t = {0};
    memset(s, 0, sizeof *s);
    err[0] = '\0';
    int rc = read_trace(json, &t, &s->failures, err, errlen);
    if (rc == 0) rc = choose_from(&t, from_step, s, err, errlen);
    if (rc == 0 && !(s->rank = calloc((size_t)t.n, sizeof *s->rank)))
        rc = (dt_strf(err, errlen, "out of memory"), -1);
    if (rc == 0) qsort(t.r, (size_t)t.n, sizeof *t.r, by_pid);
    for (int i = 0; rc == 0 && i < t.n; i++, s->nranks++)
        if (rank_stats(&t.r[i], s->from_step, &s->rank[i]))
            rc = (dt_strf(err, errlen, "out of memory"), -1);
    if (rc == 0) job_means(s);
    trace_free(&t);
    if (rc) dt_trace_summary_free(s);
    return rc;
}

int dt_trace_summarize_file(const char *path, int from_step, dt_trace_summary *s, char *err,
                            size_t errlen)
{
    memset(s, 0, sizeof *s);
    char *json = dt_read_file(path, (size_t)1 << 31, NULL, err, errlen);
    if (!json) return -1;
    char why[1024];
    int rc = dt_trace_summarize(json, from_step, s, why, sizeof why);
    free(json);
    if (rc) dt_strf(err, errlen, "%s: %s", path, why);
    return rc;
}

void dt_trace_summary_free(dt_trace_summary *s)
{
    free(s->rank);
    dt_trace_failures_free(&s->failures);
    s->rank = NULL;
    s->nranks = 0;
}
