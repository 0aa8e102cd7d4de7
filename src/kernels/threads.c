/*
 * The kernels' thread count. OpenMP keeps its thread count per calling
 * thread, so a count set on one thread does not reach kernels called from
 * another (a data-parallel worker thread, say). The count is therefore kept
 * here, and dt_kernels_threads() re-applies it to whichever thread asks:
 * every kernel asks on entry, which also sets it for oneDNN, which reads the
 * calling thread's OpenMP count when a matmul runs.
 *
 * The trainer flushes denormal floats to zero on its threads
 * (dt_kernels_flush_denormals; threads made later inherit it). A softmax
 * whose probabilities pass through the denormal range (a token that never
 * occurs: its logit falls for a while) ran steps about 60 times slower on
 * an AMD EPYC with AVX-512, the matrix products reading denormals at a
 * fraction of their speed. Flushed, values under 1.2e-38 become zeros,
 * which changes a sum only where its other terms are as small (TensorFlow
 * flushes by default too).
 */
#include "kernels/threads.h"

#include <omp.h>
#include <stdatomic.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

static _Atomic int configured_threads; /* 0: not set, OpenMP's own default */

/* FTZ and DAZ (x86's MXCSR), or FZ (AArch64's FPCR), on this thread. */
static void flush_here(void)
{
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(_mm_getcsr() | 0x8040);
#elif defined(__aarch64__)
    unsigned long fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    __asm__ volatile("msr fpcr, %0" : : "r"(fpcr | (1ul << 24)));
#endif
}

void dt_kernels_set_threads(int n)
{
    if (n < 1) n = 1;
    atomic_store(&configured_threads, n);
    omp_set_num_threads(n);
}

void dt_kernels_flush_denormals(void)
{
    flush_here();
#pragma omp parallel
    flush_here();
}

int dt_kernels_threads(void)
{
    int n = atomic_load(&configured_threads);
    if (n < 1) return omp_get_max_threads();
    if (omp_get_max_threads() != n) omp_set_num_threads(n);
    return n;
}
