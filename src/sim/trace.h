/*
 * The timeline of a simulated run, in the Trace Event JSON that `dtrain
 * train --trace` writes (train/trace_file.h) and ui.perfetto.dev opens:
 * one process per rank (pid = rank), lanes compute, communication and
 * steps as threads, times in microseconds (simulated, from 0). Ten
 * thousand ranks would make a file no viewer opens, so above `max` ranks
 * a sample is kept: the first and last host's ranks and an even stride
 * through the rest, named in the file's otherData.
 */
#ifndef DT_SIM_TRACE_H
#define DT_SIM_TRACE_H

#include <stddef.h>

#include "core/trace.h"

typedef struct dt_sim_trace dt_sim_trace;

/* A recorder for ranks of `per_host` to a host, keeping at most about
 * `max` of them. NULL out of memory. */
dt_sim_trace *dt_sim_trace_new(int ranks, int per_host, int max);
void dt_sim_trace_free(dt_sim_trace *t);
/* The engine's span callback (sim/engine.h dt_sim_span_fn); ctx is the
 * recorder. */
void dt_sim_trace_span(void *ctx, int rank, dt_trace_lane lane, const char *name, double t0,
                       double t1, double bytes);
/* Ranks kept, and whether they are all of them. */
int dt_sim_trace_kept(const dt_sim_trace *t);
/* The file, written atomically. 0, or -1 with a message naming it. */
int dt_sim_trace_write(const dt_sim_trace *t, const char *path, char *err, size_t len);

#endif
