/* Ctrl-C and SIGTERM during a training run: the first asks the loop to stop
 * after the current step (and save); a second ends the process at once.
 *
 * The signals are taken by a thread of their own (sigwait), with both
 * blocked in the thread that starts it and so in every thread created
 * after: no handler ever runs on a compute thread. That matters because
 * oneDNN 2.6's JIT GEMM kernels point the stack pointer into the heap while
 * they run; a handler that interrupted one would write its frame there
 * (measured: 3 in 20 interrupted runs died in free() with "corrupted size
 * vs. prev_size"). A handler stays installed for threads that existed
 * before (they keep their masks): it records the signal the same way. */
#ifndef DT_TRAIN_STOP_SIGNALS_H
#define DT_TRAIN_STOP_SIGNALS_H

/* Starts watching; 0, or -1 when the thread cannot be started (the handler
 * alone then catches them). */
int dt_stop_signals_start(void);
/* The number of the first signal since the start, or 0. */
int dt_stop_signals_pending(void);
/* Stops watching and restores the mask and the handlers. */
void dt_stop_signals_end(void);

#endif
