/*
 * The attention kernels' thread driver (attention_slices.h): an OpenMP
 * loop over the slices, static schedule, the scratch allocated per thread
 * once for all its slices.
 */
#include "kernels/attention_slices.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "kernels/threads.h"

int attn_run_slices(const attn_slices *job, int B, int NH)
{
    if (B <= 0 || NH <= 0) return 0;
    size_t bytes = (job->scratch_bytes + 63) / 64 * 64; /* aligned_alloc takes whole multiples */
    int nt = dt_kernels_threads(), failed = 0;
#pragma omp parallel num_threads(nt) reduction(| : failed)
    {
        void *scratch = aligned_alloc(64, bytes ? bytes : 64);
        /* the softmax loops read whole rows of score blocks, beyond the keys */
        if (scratch) memset(scratch, 0, bytes);
        failed = scratch == NULL;
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            if (scratch)
                job->run(job->ctx, scratch, bh / NH, bh % NH);
            else
                job->fail(job->ctx, bh / NH, bh % NH);
        }
        free(scratch);
    }
    if (failed) dt_log(DT_LOG_ERROR, "%s", job->what);
    return failed ? -1 : 0;
}

size_t attn_scratch_carve(float *base, float **const at[], const size_t floats[], int n)
{
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        if (base) *at[i] = base + used;
        used += floats[i];
    }
    return used * sizeof(float);
}

void attn_fill_nan(float *x, size_t ld, int rows, int HS)
{
    for (int t = 0; t < rows; t++)
        for (int j = 0; j < HS; j++) x[t * ld + j] = NAN;
}
