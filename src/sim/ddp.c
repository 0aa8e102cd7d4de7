/* A DDP step (ddp.h): the layout step of data parallelism alone, tp = cp =
 * pp = 1 and no ZeRO (layout.h), whose buckets are DDP's own over the
 * model's real layout. */
#include "sim/ddp.h"

#include <stdio.h>
#include <string.h>

#include "sim/layout.h"

int dt_sim_ddp_run(dt_sim_world *w, const dt_sim_ddp_opts *o, dt_sim_span_fn span, void *ctx,
                   dt_sim_ddp *out, char *err, size_t len)
{
    dt_sim_layout_opts l = {.cfg = o->cfg, .seq = o->seq, .tp = 1, .cp = 1, .pp = 1, .V = 1,
                            .micro = o->batch, .accum = 1, .sched = DT_PP_1F1B,
                            .flops_per_s = o->flops_per_s, .mem_GBps = o->mem_GBps,
                            .bucket_bytes = o->bucket_bytes, .algo = o->algo, .nics = o->nics};
    dt_sim_layout r;
    memset(out, 0, sizeof *out);
    if (dt_sim_layout_check(&l, w->ranks, err, len) ||
        dt_sim_layout_run(w, &l, span, ctx, &r, err, len))
        return -1;
    *out = (dt_sim_ddp){.params = r.params, .nbuckets = r.dp_colls, .forward_s = r.fwd_s,
                        .backward_s = r.bwd_s, .optimizer_s = r.optimizer_s,
                        .comm_predicted_s = r.dp_predicted_s, .step_s = r.step_s,
                        .slowest = r.slowest, .mean = r.mean, .slowest_rank = r.slowest_rank,
                        .record_s = r.record_s, .run_s = r.run_s, .events = r.events,
                        .messages = r.messages};
    snprintf(out->algos, sizeof out->algos, "%s", r.algos);
    return 0;
}
