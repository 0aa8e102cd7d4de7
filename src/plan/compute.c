/* The compute a rank brings: measured here, or for a cluster nobody here
 * can measure, a link preset's GPU class: the vendor's dense bf16 peak
 * and memory bandwidth, of which a plan assumes half sustained (large
 * transformer runs report 40-60% of peak in their matrix products; the
 * optimizer streams its state at about half the memory's peak). A
 * --tflops figure replaces the compute. See plan.h. */
#include <string.h>

#include "core/str.h"
#include "kernels/threads.h"
#include "parallel/pipeline/partition_cost.h"
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

/* The throwaway model a measurement runs: the model's width and heads (a
 * layer's products), a small vocabulary (the head and the embeddings are
 * not timed) and 3 layers (dt_pp_measure_costs), at a sequence of at most
 * DT_PLAN_MEASURE_T tokens. */
static int measured_shape(const dt_gpt_config *m, int T, dt_gpt_config *small)
{
    *small = *m;
    small->n_layer = 3;
    if (small->vocab_size > 256) small->vocab_size = 256;
    return T < DT_PLAN_MEASURE_T ? T : DT_PLAN_MEASURE_T;
}

void dt_plan_measure_cost(const dt_gpt_config *m, int T, int *tokens, double *bytes,
                          double *flops)
{
    dt_gpt_config small;
    const int t = measured_shape(m, T, &small);
    /* fp32 weights and gradients and a bf16 copy; three parts' activations */
    *bytes = 10.0 * (double)dt_gpt_param_count(&small) +
             3.0 * (double)dt_gpt_config_layer_act_bytes(m, 1, t);
    /* a warm-up pass and one timed, three layers each */
    *flops = 2 * 3 * (double)t * dt_gpt_layer_flops_per_token(m, t);
    *tokens = t;
}

int dt_plan_measure_flops(const dt_gpt_config *m, int T, int bf16, int threads, double *flops,
                          char *err, size_t n)
{
    dt_gpt like;
    dt_pp_costs k;
    dt_gpt_config small;
    const int t = measured_shape(m, T, &small);
    if (dt_gpt_create_layout(&like, &small, bf16 ? DT_PREC_BF16 : DT_PREC_F32, err, n)) return -1;
    dt_kernels_set_threads(threads);
    dt_kernels_flush_denormals(); /* timed as a run computes (kernels/threads.h) */
    int rc = dt_pp_measure_costs(&like, 1, t, &k, err, n);
    dt_gpt_destroy(&like);
    if (rc) return -1;
    if (k.layer_ms <= 0) return dt_strf(err, n, "measuring a layer: it took no time"), -1;
    *flops = (double)t * dt_gpt_layer_flops_per_token(m, t) / (k.layer_ms * 1e-3);
    return 0;
}
