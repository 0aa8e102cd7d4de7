/* The number of threads every kernel (and oneDNN) uses: OpenMP underneath. */
#ifndef DT_KERNELS_THREADS_H
#define DT_KERNELS_THREADS_H

void dt_kernels_set_threads(int n);
int dt_kernels_threads(void);

#endif
