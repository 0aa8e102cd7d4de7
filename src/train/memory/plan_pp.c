/* A rank's plan from what it holds. See memory/plan_pp.h; the tables are
 * printed by memory/plan_pp_print.c. */
#include "train/memory/plan_pp.h"

#include <string.h>

#include "core/str.h"

/* "4 Psi_q", "12 Psi_q / N", or "0". */
static void term(char *buf, size_t n, int bytes, int sharded)
{
    if (bytes == 0) dt_strf(buf, n, "0");
    else dt_strf(buf, n, "%d Psi_q%s", bytes, sharded ? " / N" : "");
}

int dt_mem_plan_held(const dt_gpt *layout, const dt_train_config *c, int ranks,
                     const dt_rank_mem *held, dt_mem_plan *p, char *err, size_t errlen)
{
    if (held->floats == 0) return dt_mem_plan_from_config(layout, c, ranks, p, err, errlen);
    /* ZeRO-2 and -3 shard what the rank holds like the whole model (they
     * run where no pipeline splits it: the rank's layout is its slices). */
    if (c->zero_stage > 1) {
        if (dt_mem_plan_from_config_psi(layout, c, ranks, held->floats, p, err, errlen))
            return -1;
        p->bytes[DT_MEM_ACTS] = held->acts;
        return 0;
    }
    /* A stage's data-parallel copies replicate it (DDP), or split its
     * optimizer state (ZeRO-1): stage 0's or 1's P, G, K. */
    if (dt_mem_plan_from_config(layout, c, ranks, p, err, errlen)) return -1;
    const double psi = (double)held->floats;
    const int zero = c->zero_stage == 1 && ranks > 1;
    p->psi = held->floats;
    p->bytes[DT_MEM_PARAMS] = p->param_bytes * psi;
    p->bytes[DT_MEM_GRADS] = p->grad_bytes * psi;
    p->bytes[DT_MEM_OPTIM] = p->optim_bytes * psi / (zero ? ranks : 1);
    if (p->nvme > 0) {
        dt_offload_opts off = dt_config_offload_opts(c);
        dt_mem_plan_offload(p, &off, psi / (zero ? ranks : 1),
                            (size_t)(held->floats / (size_t)(zero ? ranks : 1)));
    }
    p->bytes[DT_MEM_ACTS] = held->acts;
    term(p->formula[DT_MEM_PARAMS], sizeof p->formula[0], p->param_bytes, 0);
    term(p->formula[DT_MEM_GRADS], sizeof p->formula[0], p->grad_bytes, 0);
    term(p->formula[DT_MEM_OPTIM], sizeof p->formula[0], p->optim_bytes, zero);
    if (p->nvme > 0) dt_strf(p->formula[DT_MEM_OPTIM], sizeof p->formula[0], "NVMe buffers");
    dt_strf(p->formula[DT_MEM_ACTS], sizeof p->formula[0], "slots + shared");
    p->window_params = 0;
    p->window_widened = p->o.prec == DT_PREC_BF16 ? (double)held->in_use * sizeof(float) : 0;
    /* bf16 accumulation widens, fp32 accumulation forms a later micro-batch
     * apart: the segments backward holds open, in fp32. */
    p->window_grads = p->grad_bytes == 2 || c->grad_accum > 1
                          ? (double)held->grads_open * sizeof(float) : 0;
    return 0;
}
