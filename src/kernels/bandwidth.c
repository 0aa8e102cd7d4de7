/* The copy bandwidth (bandwidth.h): the kernels' threads each copy their
 * share of a 128 MiB buffer, as a memory-bound kernel streams its
 * operands. */
#include "kernels/bandwidth.h"

#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "kernels/threads.h"

#define BYTES ((size_t)128 << 20)
#define RUNS 4

double dt_copy_bandwidth(void)
{
    char *src = malloc(BYTES), *dst = malloc(BYTES);
    if (!src || !dst) {
        free(src);
        free(dst);
        return 0;
    }
    memset(src, 1, BYTES);
    memset(dst, 0, BYTES);
    const int nt = dt_kernels_threads();
    double best = 0;
    for (int run = 0; run < RUNS; run++) {
        const uint64_t t0 = dt_now_ns();
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int k = 0; k < nt; k++) {
            const size_t lo = BYTES * (size_t)k / (size_t)nt;
            const size_t hi = BYTES * (size_t)(k + 1) / (size_t)nt;
            memcpy(dst + lo, src + lo, hi - lo);
        }
        const double s = (double)(dt_now_ns() - t0) * 1e-9;
        if (s > 0 && 2.0 * (double)BYTES / s > best) best = 2.0 * (double)BYTES / s;
    }
    free(src);
    free(dst);
    return best;
}
