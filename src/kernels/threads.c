/*
 * The kernels' thread count. OpenMP keeps its thread count per calling
 * thread, so a count set on one thread does not reach kernels called from
 * another (a data-parallel worker thread, say). The count is therefore kept
 * here, and dt_kernels_threads() re-applies it to whichever thread asks:
 * every kernel asks on entry, which also sets it for oneDNN, which reads the
 * calling thread's OpenMP count when a matmul runs.
 */
#include "kernels/threads.h"

#include <omp.h>
#include <stdatomic.h>

static _Atomic int configured_threads; /* 0: not set, OpenMP's own default */

void dt_kernels_set_threads(int n)
{
    if (n < 1) n = 1;
    atomic_store(&configured_threads, n);
    omp_set_num_threads(n);
}

int dt_kernels_threads(void)
{
    int n = atomic_load(&configured_threads);
    if (n < 1) return omp_get_max_threads();
    if (omp_get_max_threads() != n) omp_set_num_threads(n);
    return n;
}
