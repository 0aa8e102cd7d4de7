/* The timeline of a job as one file (--trace): every rank's recorded
 * events (core/trace.h) gathered on rank 0 and written in the Trace Event
 * JSON format that ui.perfetto.dev and chrome://tracing open. One rank is
 * one process (pid = rank), each lane one thread (tid: compute,
 * communication, steps; a job that restarted has a fourth on rank 0, its
 * failures: trace_marks.h); times are microseconds from the job's
 * earliest event, on rank 0's clock. */
#ifndef DT_TRAIN_TRACE_FILE_H
#define DT_TRAIN_TRACE_FILE_H

#include <stddef.h>

#include "dtrain/comm.h"

/* Collective over world (NULL: this process alone): how far each rank's
 * CLOCK_MONOTONIC is from rank 0's. Ranks on one host share the clock
 * (offset 0); ranks on several hosts estimate theirs from a few round trips
 * with rank 0, keeping the one of least delay. DTRAIN_TRACE_CLOCK_SYNC=1
 * estimates even on one host (the estimate is then a measured error). Call
 * before the events to be aligned are written; 0, or a DT_ERR_* code. */
int dt_trace_sync_clock(dt_comm *world);
/* What this rank adds to its clock to read rank 0's (0 until measured). */
long long dt_trace_clock_offset_ns(void);

/* Collective over world (NULL: one process): every rank's events to rank
 * 0, which writes them to path, atomically (the old file or the new one,
 * never half of one). Under restarts the ranks' earlier attempts' events
 * (trace_spool.h) and the job's failures (trace_marks.h) go in too, with
 * args.attempt on every event. 0, or -1 with a message in err (rank 0's naming the
 * file; any rank's naming a failed transfer). */
int dt_trace_write(dt_comm *world, const char *path, char *err, size_t errlen);

#endif
