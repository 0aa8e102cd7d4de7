/* What a timeline says about a restarted job's failures (`dtrain trace
 * summary`): each failure, its recovery, and the share of the wall time
 * lost, from the marks a run under restarts writes (train/trace_marks.h)
 * and the step events. The job's figures follow the run's own `failures:`
 * line (train/snapshots.c): a failure costs its recovery (from the
 * failure to the end of the first step after it, less that step) and the
 * steps it lost, at the last attempt's pace,
 *
 *   lost = sum of recoveries + (steps lost - restarts) x step time,
 *
 * kept within [0, wall]; the wall time runs from when the first attempt
 * began recording to the end of the last step. Pure computation on the
 * parsed JSON, tested on hand-made events. */
#ifndef DT_TRAIN_TRACE_FAILURES_H
#define DT_TRAIN_TRACE_FAILURES_H

#include <stddef.h>

struct cJSON;

#define DT_TRACE_HOW_LEN 96

typedef struct {
    int restart;          /* the restart it led to (1 for the first) */
    int rank;             /* the rank that failed; -1: not known */
    char how[DT_TRACE_HOW_LEN]; /* the launcher's words: "killed by signal 9 (Killed)" */
    double at_ms;         /* when, from the trace's start */
    double recovery_ms;   /* -1: no recovery in the trace (no step after it) */
    int from_step, lost;  /* where the run continued, steps lost; -1: not known */
} dt_trace_failure;

typedef struct {
    int n;                  /* failures (0: the job never failed, or the trace predates marks) */
    dt_trace_failure *f;    /* in the order of their restarts */
    int restarts;           /* the failures recovered from: the run's `failures:` count */
    long lost;              /* steps lost, of those */
    double recovery_ms, worst_ms; /* their sum, their longest */
    double wall_ms;         /* from the first attempt's start to the last step's end */
    double step_ms;         /* rank 0's mean step in the last attempt */
    double lost_ms;         /* lost to failures, as above */
} dt_trace_failures;

/* The failures of a trace's traceEvents array into out. 0, or -1 with a
 * message naming the element: a mark without its fields, or out of
 * memory. */
int dt_trace_failures_of(const struct cJSON *events, dt_trace_failures *out, char *err,
                         size_t errlen);
void dt_trace_failures_free(dt_trace_failures *f);
/* o's number under key, or dflt when it has none (o may be NULL). */
double dt_trace_num(const struct cJSON *o, const char *key, double dflt);

#endif
