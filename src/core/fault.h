/* Fault points for the restart tests: with DTRAIN_TEST_KILL_AT=POINT:STEP
 * or POINT:STEP:RANK in the environment, the rank (RANK; any rank without
 * one) kills itself with SIGKILL at the first dt_fault_point(POINT) of
 * step STEP, in the job's first attempt only (TORCHELASTIC_RESTART_COUNT
 * unset or 0), so that a test can fail a run at a chosen moment instead of
 * a random one. The points: forward (after the step's first layer),
 * backward (after its first segment), allreduce (as DDP starts a bucket's
 * all-reduce), update (after the optimizer's first range), snapshot (halfway
 * through the copy of the snapshot taken after STEP), save (a save of
 * STEP's checkpoint, once this rank's shard is written). Without the variable a point costs a load and
 * a compare.
 *
 * DTRAIN_TEST_SLOW=POINT:MS:RANK makes RANK a straggler instead: it sleeps
 * MS milliseconds at every dt_fault_point(POINT) of every step (POINT one
 * of the four inside a step), so that a test knows which rank is slowest
 * and by how much. */
#ifndef DT_CORE_FAULT_H
#define DT_CORE_FAULT_H

/* The step the training loop is in (the trainer, at each step's start);
 * the first call also reads the environment. */
void dt_fault_set_step(long step);
/* Any thread: a point of the step the loop is in. */
void dt_fault_point(const char *point);
/* A point that belongs to a given step whatever the loop's (a snapshot's
 * copy or a save, which run after their step, on another thread). */
void dt_fault_point_of(const char *point, long step);

#endif
