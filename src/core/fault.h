/* Fault points for the restart tests: with DTRAIN_TEST_KILL_AT=POINT:STEP
 * or POINT:STEP:RANK in the environment, the rank (RANK; any rank without
 * one) kills itself with SIGKILL at the first dt_fault_point(POINT) of
 * step STEP, in the job's first attempt only (TORCHELASTIC_RESTART_COUNT
 * unset or 0), so that a test can fail a run at a chosen moment instead of
 * a random one. The points: forward (after the step's first layer),
 * backward (after its first segment), allreduce (as DDP starts a bucket's
 * all-reduce), update (after the optimizer's first range), snapshot (halfway
 * through an in-memory snapshot's copy), save (halfway through a
 * checkpoint shard's write). Without the variable a point costs a load and
 * a compare. */
#ifndef DT_CORE_FAULT_H
#define DT_CORE_FAULT_H

/* The step the training loop is in (the trainer, at each step's start);
 * the first call also reads the environment. */
void dt_fault_set_step(long step);
/* Any thread. */
void dt_fault_point(const char *point);

#endif
