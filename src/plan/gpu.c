/* The compute a link preset's GPU class brings, for `dtrain plan` on a
 * cluster nobody here can measure: the vendor's dense bf16 peak and memory
 * bandwidth, of which a plan assumes half sustained (large transformer
 * runs report 40-60% of peak in their matrix products; the optimizer
 * streams its state at about half the memory's peak). A --tflops figure
 * replaces the compute. See plan.h. */
#include <string.h>

#include "core/str.h"
#include "plan/plan.h"

typedef struct {
    const char *links, *gpu;
    double peak_tflops, mem_TBps;
} gpu_class;

static const gpu_class classes[] = {
    {"nvlink-ib", "A100 SXM", 312, 2.0},  /* bf16 dense 312 TFLOP/s, HBM2e 2.0 TB/s */
    {"nvlink-ndr", "H100 SXM", 989, 3.35}, /* bf16 dense 989 TFLOP/s, HBM3 3.35 TB/s */
    {"pcie-eth", "A100 PCIe", 312, 1.9},  /* bf16 dense 312 TFLOP/s, HBM2e 1.9 TB/s */
};

int dt_plan_gpu(const char *links, double *flops, double *opt_Bps, char *source, size_t n)
{
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        const gpu_class *g = &classes[i];
        if (strcmp(links, g->links)) continue;
        *flops = 0.5 * g->peak_tflops * 1e12;
        *opt_Bps = 0.5 * g->mem_TBps * 1e12;
        dt_strf(source, n, "assumed: half of the %s's %.0f TFLOP/s bf16 dense peak", g->gpu,
                g->peak_tflops);
        return 1;
    }
    return 0;
}
