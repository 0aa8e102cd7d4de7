/* `dtrain simulate`'s parts (simulate.c parses and runs, simulate_report.c
 * prints the results, simulate_progress.c how far a long run has got). */
#ifndef DT_CLI_SIMULATE_H
#define DT_CLI_SIMULATE_H

#include <stdint.h>
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

/* Lines on stderr saying what a long simulation is doing, how far it has
 * got and about how long it has left: the first once the command has run
 * 5 s (and the phase 1 s), then one every DTRAIN_SIM_PROGRESS_S seconds
 * (default 10; 0: at every report), and a last one when a reported phase
 * ends. */
typedef struct {
    double every_s;
    uint64_t start_ns, phase_ns, last_ns; /* the command's start, the phase's, the last line */
    char what[128];                       /* the phase */
    int told, ended;                      /* lines printed in it; its last one */
} sim_progress;

/* 0, or -1 with a message (DTRAIN_SIM_PROGRESS_S malformed). */
int sim_progress_init(sim_progress *p, char *err, size_t len);
/* A world's progress function (sim/world.h); ctx: the sim_progress. */
void sim_progress_tell(void *ctx, const char *what, double done, double total);

#endif
