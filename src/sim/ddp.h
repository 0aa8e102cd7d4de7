/*
 * A DDP training step, simulated: every rank runs forward, then backward
 * layer by layer from the output head down, and DDP's buckets (the real
 * bucketing of parallel/ddp.c over the real flat layout of model/gpt.h)
 * all-reduce on a communication stream as soon as backward has finished
 * their gradients, overlapping the rest of backward; the optimizer runs
 * once the last bucket is reduced.
 *
 * It is the layout step (layout.h) of data parallelism alone, tp = cp =
 * pp = 1 without ZeRO, which models the compute and the optimizer; this
 * header keeps DDP's own figures (its buckets, their predicted all-reduces
 * one after another) for `dtrain simulate --ddp`'s report.
 */
#ifndef DT_SIM_DDP_H
#define DT_SIM_DDP_H

#include <stddef.h>

#include "model/gpt.h"
#include "sim/engine.h"
#include "sim/world.h"

typedef struct {
    dt_gpt_config cfg;
    int batch, seq;      /* per rank: batch sequences of seq tokens */
    double flops_per_s;  /* sustained, per rank */
    double mem_GBps;     /* for the optimizer */
    size_t bucket_bytes; /* DDP's bucket cap */
    const char *algo;    /* the all-reduce's algorithm; NULL or "auto": auto's choice */
    int nics;            /* per host */
} dt_sim_ddp_opts;

typedef struct {
    size_t params;
    int nbuckets;
    char algos[128];        /* the all-reduce algorithms that ran, e.g. "rhd" */
    double forward_s, backward_s, optimizer_s; /* one rank's compute */
    double comm_predicted_s;  /* every bucket's all-reduce by the cost model, summed */
    double step_s;            /* simulated */
    dt_sim_rank_stats slowest, mean; /* the rank that finished last; the average rank */
    int slowest_rank;
    double record_s, run_s;   /* wall time */
    long long events, messages;
} dt_sim_ddp;

/* Builds the step for every rank of w, runs it (span, when not NULL,
 * receives the timeline), fills out. 0, or -1 with a message. */
int dt_sim_ddp_run(dt_sim_world *w, const dt_sim_ddp_opts *o, dt_sim_span_fn span, void *ctx,
                   dt_sim_ddp *out, char *err, size_t len);

#endif
