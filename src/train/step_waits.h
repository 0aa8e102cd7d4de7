/* A step's communication waits, seen across the ranks that step together.
 * A rank's own wait mixes two things: communication that compute did not
 * hide, and time spent behind a slower rank (a straggler: a busier core, a
 * noisy neighbour, an uneven batch). The rank whose compute was the
 * critical path waits only for the first, so the least wait of any rank is
 * the step's exposed communication, and the rest of a rank's wait is the
 * straggler's cost. Private to src/train. */
#ifndef DT_TRAIN_STEP_WAITS_H
#define DT_TRAIN_STEP_WAITS_H

#include <stdio.h>

struct dt_run;

typedef struct {
    int known;         /* 0: no peers in lockstep (one rank, asynchronous ranks) */
    double exposed_ms; /* the least any rank waited */
    double most_ms;    /* the most any rank waited */
    int slowest;       /* the world rank that waited least (the lowest, on a tie) */
} dt_step_waits;

/* Collective over the lockstep group (every rank of it, after each step):
 * mine_ms is this rank's wait. 0, or -1 with the run's error. */
int dt_step_waits_agree(struct dt_run *t, long step, double mine_ms, dt_step_waits *w);

/* The run's waits, summed over the steps counted, for the line at its end. */
typedef struct {
    long steps;
    double step_ms, exposed_ms, mine_ms;
    int ranks;     /* the world's */
    long *slowest; /* [ranks]: the steps each rank was the slowest in; NULL until needed */
} dt_waits_total;

/* Adds a step whose waits are known; without memory for the ranks' counts
 * the slowest rank is left out of the report. */
void dt_step_waits_count(dt_waits_total *w, const dt_step_waits *s, double mine_ms,
                         double step_ms, int ranks);
/* One line on f, when any step was counted: the exposed communication and
 * this rank's wait a step, and the rank that was slowest most often. */
void dt_step_waits_report(FILE *f, const dt_waits_total *w, int rank);
void dt_step_waits_free(dt_waits_total *w);

#endif
