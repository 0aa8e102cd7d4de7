/* Per-stage memory of a pipeline by arithmetic over the layout. See
 * memory/plan_pp.h; the tables are printed by memory/plan_pp_print.c. */
#include "train/memory/plan_pp.h"

#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "parallel/pipeline/pipeline.h"

/* "4 Psi_q", "12 Psi_q / N", or "0". */
static void term(char *buf, size_t n, int bytes, int sharded)
{
    if (bytes == 0) dt_strf(buf, n, "0");
    else dt_strf(buf, n, "%d Psi_q%s", bytes, sharded ? " / N" : "");
}

int dt_mem_plan_held(const dt_gpt *layout, const dt_train_config *c, int ranks,
                     const dt_rank_mem *held, dt_mem_plan *p, char *err, size_t errlen)
{
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

void dt_mem_plan_pp_free(dt_mem_plan_pp *p)
{
    dt_pp_schedule_free(&p->sched);
    free(p->cut);
    free(p->stage);
    free(p->mem);
    p->cut = NULL, p->stage = NULL, p->mem = NULL;
}

/* Stage q's holdings and plan. 0, or -1 with err. */
static int plan_stage(const dt_gpt *layout, const dt_train_config *c, dt_mem_plan_pp *p, int q,
                      int T, char *err, size_t errlen)
{
    dt_pp_stage_mem *m = &p->mem[q];
    if (dt_pp_stage_memory(layout, &p->sched, p->cut, q, c->batch_size, T, m))
        return dt_strf(err, errlen, "pipeline stage %d: out of memory for its plan", q), -1;
    dt_rank_mem held = {m->floats, m->in_use, m->grads_open, m->acts, p->dp};
    return dt_mem_plan_held(layout, c, p->dp, &held, &p->stage[q], err, errlen);
}

int dt_mem_plan_pp_from_config(const dt_gpt *layout, const dt_train_config *c, int world,
                               dt_mem_plan_pp *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->psi = dt_gpt_param_count(&layout->cfg);
    p->recompute = layout->acts.recompute;
    dt_parallel_opts o = dt_config_parallel_opts(c);
    if (dt_pp_part_parse(c->pp_partition, &p->part))
        return dt_strf(err, errlen, "--pp-partition %s: use uniform, params or cost",
                       c->pp_partition), -1;
    /* Measuring would build and run a model: a plan builds none. */
    if (p->part == DT_PP_PART_COST)
        return dt_strf(err, errlen, "--pp-partition cost: the cut depends on times measured "
                       "when the run starts; plan with uniform or params"), -1;
    if (dt_pp_check_schedule(&o, world, c->grad_accum, &p->dp, &p->sched, err, errlen))
        return -1;
    const int S = p->sched.p * p->sched.V, T = c->seq_len ? c->seq_len : layout->cfg.block_size;
    p->cut = malloc((size_t)(S + 1) * sizeof *p->cut);
    p->stage = calloc((size_t)p->sched.p, sizeof *p->stage);
    p->mem = calloc((size_t)p->sched.p, sizeof *p->mem);
    if (!p->cut || !p->stage || !p->mem)
        return dt_strf(err, errlen, "pipeline plan: out of memory"), -1;
    if (dt_pp_cut(layout, S, p->part, p->sched.kind == DT_PP_INTERLEAVED, NULL, p->cut, err,
                  errlen))
        return -1;
    for (int q = 0; q < p->sched.p; q++)
        if (plan_stage(layout, c, p, q, T, err, errlen)) return -1;
    return 0;
}
