/* The recorder of a timeline (--trace): what this process computed and
 * communicated, and when, kept in memory until the run writes it
 * (train/trace_file.h). It records only: one job, so that any layer (the
 * step, DDP's buckets, ZeRO, a pipeline executor) can add an event with
 * two clock reads and one call, and pays one branch when recording is off.
 *
 * Times are CLOCK_MONOTONIC nanoseconds (core/timer.h dt_now_ns()); an
 * event's name is a string literal, kept by pointer. Several threads may
 * add at once (DDP's buckets complete on the caller's thread while another
 * layer records): additions take a lock, a few hundred per step at most. */
#ifndef DT_CORE_TRACE_H
#define DT_CORE_TRACE_H

#include <stddef.h>
#include <stdint.h>

/* Which row of the timeline an event belongs to (the trace's tid). */
typedef enum { DT_TRACE_COMPUTE = 0, DT_TRACE_COMM = 1, DT_TRACE_STEP = 2 } dt_trace_lane;
#define DT_TRACE_LANES 3

/* What an event was about; -1 in a field: absent (not written). */
typedef struct {
    int step, micro, stage, layer_lo, layer_hi, peer;
    long long bytes;
} dt_trace_args;

typedef struct {
    const char *name;
    uint64_t start_ns, end_ns;
    dt_trace_lane lane;
    dt_trace_args a;
} dt_trace_event;

/* Every field -1. */
dt_trace_args dt_trace_noargs(void);
/* Recording on for this process, the events of an earlier recording
 * dropped. 0, or -1 when memory for the first events cannot be had. */
int dt_trace_start(void);
/* When recording last started (dt_now_ns()), or 0 when it never did. */
uint64_t dt_trace_started_ns(void);
/* Recording off; the events are freed. Safe when never started. */
void dt_trace_stop(void);
/* Whether recording is on (one load). */
int dt_trace_on(void);
/* dt_now_ns() when recording is on, else 0: the start of an event to add,
 * without a clock read when off. */
uint64_t dt_trace_now(void);
/* One event (a NULL a: no args). Nothing happens when recording is off;
 * an event that finds no memory is dropped and counted. */
void dt_trace_add(dt_trace_lane lane, const char *name, uint64_t start_ns, uint64_t end_ns,
                  const dt_trace_args *a);
/* A copy of the events recorded so far, in the order added (malloc'd; the
 * caller frees it; NULL when there are none), and how many were dropped.
 * 0, or -1 out of memory. */
int dt_trace_snapshot(dt_trace_event **ev, size_t *n, size_t *dropped);
/* The same from the first-th event recorded on (events keep their place
 * in that order, so a caller that saved what it copied so far gets only
 * the new ones). */
int dt_trace_snapshot_from(size_t first, dt_trace_event **ev, size_t *n, size_t *dropped);

#endif
