/* The number of threads every kernel (and oneDNN) uses: OpenMP underneath. */
#ifndef DT_KERNELS_THREADS_H
#define DT_KERNELS_THREADS_H

void dt_kernels_set_threads(int n);
/* Denormal floats flushed to zero on the calling thread and OpenMP's, and
 * so on every thread they start later (threads.c says why). A program
 * calls it before it starts threads that add floats its results depend
 * on (the trainer: before the communicator's progress thread), so that
 * every sum of a run is made the same way. The kernels themselves keep
 * IEEE's denormals where nobody asks (their tests check them). */
void dt_kernels_flush_denormals(void);
int dt_kernels_threads(void);

#endif
