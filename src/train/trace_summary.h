/* What a timeline says about each rank (`dtrain trace summary`): of the
 * time its steps took, the fraction it computed, the fraction it only
 * communicated (communication that compute did not hide), and the rest,
 * idle. Pure computation on the Trace Event JSON that --trace writes
 * (train/trace_file.h), so it is tested on hand-made intervals; the CLI
 * only prints.
 *
 * A rank's window is the union of its "step" events (tid 2) whose step is
 * at least from_step. Within it, busy is the union of its compute events
 * (tid 0), communication the union of its comm events (tid 1) minus what
 * compute overlaps, idle the remainder: the three add up to 1. A restarted
 * job's failures come with them (trace_failures.h). */
#ifndef DT_TRAIN_TRACE_SUMMARY_H
#define DT_TRAIN_TRACE_SUMMARY_H

#include <stddef.h>

#include "train/trace_failures.h"

typedef struct {
    int rank;          /* the trace's pid; -1 for the job's line */
    int steps;         /* step events in the window */
    double window_ms;  /* 0: no step in the window (a parameter server) */
    double busy, comm, idle; /* fractions of the window (0 when it is empty) */
} dt_trace_rank_stats;

typedef struct {
    int nranks;
    dt_trace_rank_stats *rank; /* by rank */
    int from_step;             /* the first step counted */
    int first_step, last_step; /* of the trace */
    /* Means over the ranks with a window (their mean window_ms too);
     * steps: how many ranks that is. */
    dt_trace_rank_stats job;
    dt_trace_failures failures; /* a restarted job's (trace_failures.h); n 0: none */
} dt_trace_summary;

/* from_step < 0: the default, the trace's first step + 1 when it holds
 * more than one step (the first pays for kernel generation), else its
 * first. 0, or -1 with a message: not JSON, no events, no step events,
 * from_step beyond the last step. */
int dt_trace_summarize(const char *json, int from_step, dt_trace_summary *s, char *err,
                       size_t errlen);
/* The same, reading the file at path. */
int dt_trace_summarize_file(const char *path, int from_step, dt_trace_summary *s, char *err,
                            size_t errlen);
void dt_trace_summary_free(dt_trace_summary *s);

#endif
