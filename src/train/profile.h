/* `dtrain train --profile`: where a step's time goes on this rank, by
 * part (the kernels' own accounts, kernels/profile.h; the communication
 * the step waited for; the data), each beside its roofline bound: its
 * FLOPs at the measured peak or its bytes at the measured copy bandwidth,
 * whichever takes longer. */
#ifndef DT_TRAIN_PROFILE_H
#define DT_TRAIN_PROFILE_H

#include <stdint.h>

struct dt_run;

/* Before the first step: the bandwidth measured, the kernels' counters on. */
void dt_run_profile_start(struct dt_run *t);
/* After each step: its parts added up (the first step, which builds the
 * kernels, left out). comm_ms is this rank's wait for communication. */
void dt_run_profile_step(struct dt_run *t, double step_ms, double comm_ms);
/* A rank's data loading time, for the step's account. */
void dt_run_profile_data(struct dt_run *t, uint64_t ns);
/* The last step's parts for the JSON log: their count (0 when off), names
 * and milliseconds. */
int dt_run_profile_last(const struct dt_run *t, const char *const **names, const double **ms);
/* The table (rank 0, of its own steps). */
void dt_run_profile_report(struct dt_run *t);

#endif
