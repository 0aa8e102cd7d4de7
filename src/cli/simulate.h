/* `dtrain simulate`'s parts (simulate.c parses and runs, simulate_report.c
 * prints). */
#ifndef DT_CLI_SIMULATE_H
#define DT_CLI_SIMULATE_H

#include <stdio.h>

#include "sim/bench.h"
#include "sim/layout.h"
#include "sim/world.h"

void sim_report_collective(FILE *f, const dt_sim_world *w, int nics, const char *kind,
                           const dt_sim_bench *b);
/* --ddp's: DDP's buckets and their predicted all-reduces beside the step. */
void sim_report_ddp(FILE *f, const dt_sim_world *w, const dt_sim_layout_opts *o,
                    const dt_sim_layout *d);
void sim_report_layout(FILE *f, const dt_sim_world *w, const dt_sim_layout_opts *o,
                       const dt_sim_layout *l);

#endif
