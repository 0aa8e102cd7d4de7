/* A restarted job's timeline (--trace under a launcher that restarts,
 * `dtrain launch --max-restarts K`): the file is written once, at the
 * end, by rank 0 of the attempt that finishes, and a rank that is killed
 * writes nothing. So while the job may still fail, each rank appends the
 * events it records, on rank 0's clock, to a file of its own in the job's
 * directory in shared memory (train/ckpt/snapshot.h) after every step,
 *
 *   /dev/shm/dtrain-snap-<DTRAIN_JOB_ID>/trace-<rank>.<attempt>
 *
 * and the ranks of a restarted attempt read their earlier attempts' files
 * back and send them to rank 0 with their own events (trace_file.c). The
 * records are the ones trace_file.c sends over the wire. What a killed
 * rank recorded after its last completed step is lost. */
#ifndef DT_TRAIN_TRACE_SPOOL_H
#define DT_TRAIN_TRACE_SPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "core/trace.h"

#define DT_TRACE_NAME_LEN 32

/* One event as it travels to rank 0 or into a spool file (the same binary
 * on every rank: the same layout), its times on rank 0's clock. attempt:
 * the restarts before the attempt that recorded it (-1: not known). */
typedef struct {
    char name[DT_TRACE_NAME_LEN];
    int32_t lane, step, micro, stage, layer_lo, layer_hi, peer, attempt;
    int64_t bytes, start_ns, end_ns;
} dt_trace_record;

/* e as a record: its times plus offset_ns (this rank's clock to rank 0's). */
void dt_trace_record_of(const dt_trace_event *e, long long offset_ns, int attempt,
                        dt_trace_record *r);

/* From now on this rank's events go to dir's spool file of (rank,
 * attempt), created empty. 0, or -1 with a message (nothing is spooled;
 * the earlier attempts' files are still read back). */
int dt_trace_spool_open(const char *dir, int rank, long attempt, long long offset_ns, char *err,
                        size_t errlen);
/* Appends the events recorded since the last call (a step's). 0 (also
 * when not spooling), or -1 with a message the first time a write fails:
 * the file then takes no more. */
int dt_trace_spool_step(char *err, size_t errlen);
/* The attempt opened, or -1 when none is. */
long dt_trace_spool_attempt(void);
/* This rank's events of the attempts before the one being spooled, in
 * order (malloc'd, NULL when none; a file that is missing or unreadable
 * contributes nothing, a torn last record is left out). 0, or -1 out of
 * memory. */
int dt_trace_spool_earlier(dt_trace_record **out, size_t *n);
void dt_trace_spool_close(void);

#endif
