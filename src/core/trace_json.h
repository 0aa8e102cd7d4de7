/* The pieces of a Trace Event JSON file (what ui.perfetto.dev and
 * chrome://tracing open) that a real run's timeline (train/trace_file.c)
 * and a simulated one (sim/trace.c) write alike, so that the two files
 * have the same shape: one process per rank, one thread per lane. */
#ifndef DT_CORE_TRACE_JSON_H
#define DT_CORE_TRACE_JSON_H

#include <stdio.h>

#include "core/trace.h"

/* A lane's thread name ("communication") and its events' category
 * ("comm"). */
extern const char *const dt_trace_lane_names[DT_TRACE_LANES];
extern const char *const dt_trace_lane_cats[DT_TRACE_LANES];

/* The separator before an element of traceEvents (none before the first). */
void dt_trace_json_next(FILE *f, int *first);

/* s as a JSON string, quoted and escaped: a quote or a control character
 * in a name must not break the file. */
void dt_trace_json_str(FILE *f, const char *s);

/* Rank r's metadata: its process name and sort order, its lanes' names. */
void dt_trace_json_rank(FILE *f, int rank, int *first);

#endif
