/*
 * One collective on its own, timed in the simulator as `dtrain bench
 * comm` times it on real ranks: every rank starts it at time 0, and its
 * time is the last rank's end. The analytic prediction of the cost model
 * (dt_cost_predict: the slowest rank's steps summed, no contention) comes
 * with it, so the two can be read side by side.
 */
#ifndef DT_SIM_BENCH_H
#define DT_SIM_BENCH_H

#include <stddef.h>

#include "sim/world.h"

typedef struct {
    char algo[24];     /* the algorithm that ran */
    size_t bytes;      /* as recorded (rounded to whole elements) */
    double seconds;    /* simulated */
    double predicted;  /* the cost model's */
    size_t steps;      /* over all ranks */
    size_t sched_bytes;        /* the recording's size */
    double record_s, run_s;    /* wall time to record, to simulate */
    long long events, messages;
} dt_sim_bench;

/* kind by name (sim/coll.h), algo NULL or "auto" for auto's choice. 0, or
 * -1 with a message. */
int dt_sim_bench_coll(dt_sim_world *w, int nics, const char *kind, const char *algo,
                      size_t bytes, dt_sim_bench *out, char *err, size_t len);

#endif
