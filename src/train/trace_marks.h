/* A restarted job's failures in its timeline (--trace under `dtrain launch
 * --max-restarts K`): rank 0 of each attempt appends to a file in the
 * job's directory in shared memory (train/ckpt/snapshot.h),
 *
 *   /dev/shm/dtrain-snap-<DTRAIN_JOB_ID>/trace-marks
 *
 * when the attempt began recording, the failure that ended the attempt
 * before (the launcher's DTRAIN_FAILED_RANK, DTRAIN_FAILURE and
 * DTRAIN_FAILURE_NS), and its recovery: from the failure to the end of
 * the first step after it, the step the run continued from and the steps
 * lost (the interval of the `recovered:` line). The attempt that writes
 * the timeline adds them to rank 0's process on a row of their own (tid
 * 3, "restarts"):
 *
 *   attempt   an instant: recording began (args.attempt)
 *   failure   an instant across every rank (args: restart, rank, how)
 *   recovery  a complete event (args: restart, from_step, steps_lost)
 *
 * Times are rank 0's CLOCK_MONOTONIC, the clock of the job's events and of
 * the launcher on rank 0's host. */
#ifndef DT_TRAIN_TRACE_MARKS_H
#define DT_TRAIN_TRACE_MARKS_H

#include <stdint.h>
#include <stdio.h>

#define DT_TRACE_MARKS_TID 3

/* Rank 0 of an attempt: marks go to dir from now on (attempt 0 starts the
 * file afresh). began_ns: when recording began; failure_ns 0: no failure
 * to mark (a first attempt, or a launcher that does not say when). 0, or
 * -1 with a message (no marks are kept). */
int dt_trace_marks_open(const char *dir, long attempt, uint64_t began_ns, uint64_t failure_ns,
                        const char *failed_rank, const char *how, char *err, size_t errlen);
/* The launcher's log of the job's failures (DTRAIN_FAILURES: a line each,
 * "RESTART NS RANK HOW"): each one of an earlier attempt that the file
 * does not mark yet, an attempt that failed before its rank 0 opened the
 * marks, is marked now. NULL or empty: nothing. */
void dt_trace_marks_backfill(const char *failures);
/* The recovery from this attempt's failure: took_ns from failure_ns.
 * Nothing when no marks are kept. */
void dt_trace_mark_recovery(uint64_t failure_ns, uint64_t took_ns, long from_step, long lost);
void dt_trace_marks_close(void);

/* The marks of the job so far, for the file (rank 0). */
typedef struct dt_trace_marks dt_trace_marks;
/* NULL when there are none to show: no marks kept, or no failure among
 * them (a job that never failed has the timeline it had without them). */
dt_trace_marks *dt_trace_marks_read(void);
/* The earliest mark's time (ns), for the file's t0. */
long long dt_trace_marks_t0(const dt_trace_marks *m);
/* The marks as Trace Event JSON elements, times from t0 (ns). */
void dt_trace_marks_put(FILE *f, const dt_trace_marks *m, long long t0, int *first);
void dt_trace_marks_free(dt_trace_marks *m);

#endif
