/*
 * A training step of a 4D layout, simulated: ranks = tp x cp x dp x pp in
 * Megatron's order (parallel/mesh.h), each running its pipeline rank's
 * real action list (parallel/pipeline/schedule.h), with the collectives
 * of tensor parallelism inside its compute and data parallelism (DDP or
 * ZeRO) over its replicas beside it.
 *
 * Per rank, two streams:
 *   compute: each F/B/I/W is its chunk's layers one after another (the
 *     head on the last stage), each layer's products a share of the FLOPs
 *     (dt_gpt_flops_per_token split into the head and equal layers; a
 *     third forward, two thirds backward, I and W half the backward each)
 *     over tp x cp ranks at the sustained rate; under tp, each layer's
 *     two all-reduces of the micro-batch's B (T/cp) C fp32 activations
 *     (forward, and the input gradient's backward: B or I) run on this
 *     stream, splitting the layer's compute in halves, as the real layer
 *     blocks on them. A stage boundary is a SEND after F (to the next
 *     stage's rank at the same tp, cp, dp place) or after B/I (to the
 *     previous), and a RECV before the action that needs it, of the
 *     boundary activation B (T/cp) C fp32 (divided by tp under sequence
 *     parallelism). The optimizer runs once the gradients are reduced:
 *     28 bytes a parameter it updates at mem_GBps (memory-bound AdamW).
 *   comm: the data-parallel collectives over the replicas (the cp x dp
 *     ranks with the same tp_i and pp_i), each started when the compute
 *     stream has issued it (SIGNAL) and awaited where the compute needs it
 *     (WAIT):
 *     zero 0: DDP's buckets (parallel/ddp.c's bucketing of the stage's
 *       segments), all-reduced as the last micro-batch's backward (W
 *       under zb1p) finishes them;
 *     zero 1, 2: each segment's gradients reduce-scattered as backward
 *       finishes it (stage 1: the last micro-batch; 2: every one), the
 *       optimizer on 1/(cp dp) of them, then every segment all-gathered;
 *     zero 3: every layer's (segment's) parameters all-gathered before
 *       each forward and each backward that uses it, issued when the
 *       use `prefetch` before it starts (prefetch 0: when it is needed),
 *       and its gradients reduce-scattered after each backward.
 * With experts and ep > 1, each moe layer's exchanges over its ep group
 * (ep consecutive data-parallel ranks) run on the compute stream after
 * the layer's products, as the real layer blocks on them: forward an
 * all-to-all of the counts (E ints) and two of the rows (out to the
 * experts and back), backward (B or I) two of the rows, each of B T K C
 * fp32 times moe_skew (the busiest rank's share over the mean). Until the
 * variable all-to-all is in comm/, they run as the even all-to-all of
 * that size.
 * The first stage holds the embeddings, the last the final norm and the
 * head: an untied head's own weight (V C, the Llama family's), or a tied
 * head's copy of the embeddings (GPT-2's), whose gradients it reduces
 * with the rest of its stage's.
 * Every rank of a pipeline rank's stages runs the same programs: peers are
 * offsets and collectives are over groups (sim/group.h).
 */
#ifndef DT_SIM_LAYOUT_H
#define DT_SIM_LAYOUT_H

#include <stddef.h>

#include "model/gpt.h"
#include "parallel/pipeline/schedule.h"
#include "sim/engine.h"
#include "sim/world.h"

/* The classes of exposed communication (engine.h's cls). */
enum { DT_SIM_CLS_TP, DT_SIM_CLS_PP, DT_SIM_CLS_GRADS, DT_SIM_CLS_GATHER, DT_SIM_CLS_EP };

typedef struct {
    dt_gpt_config cfg;
    int seq;                  /* tokens a sequence, T */
    int tp, cp, dp, pp, V;    /* the mesh; V model chunks per pipeline rank */
    int micro, accum;         /* B sequences a micro-batch, M micro-batches a step */
    dt_pp_kind sched;         /* pp > 1 */
    int sp;                   /* sequence parallelism: boundary messages / tp */
    int zero, prefetch;       /* ZeRO stage 0..3; stage 3's layers gathered ahead */
    int ep;                   /* expert-parallel ranks (of the dp ones); 0 or 1: none */
    double moe_skew;          /* the busiest ep rank's rows over the mean; < 1: 1 */
    double flops_per_s;       /* sustained, per rank */
    double mem_GBps;          /* for the optimizer */
    size_t bucket_bytes;      /* DDP's bucket cap */
    const char *algo;         /* the collectives' algorithm; NULL or "auto": auto's choice */
    int nics;                 /* per host */
    int cpu_comm;             /* the collectives run on the rank's own cores (a CPU host with
                               * no core to spare: shared memory moves bytes with the CPU),
                               * so they take turns with its compute instead of overlapping */
    double cpu_share;         /* > 0: a host's cores are worth this many ranks' full rates
                               * (flops_per_s), shared among the ranks computing at each
                               * instant (an oversubscribed CPU host); 0: cores of their own */
} dt_sim_layout_opts;

typedef struct {
    size_t params;            /* the model's */
    size_t params_rank;       /* the most a rank holds (its tp slice of its stages) */
    int stages, colls;        /* pipeline stages; distinct collectives recorded */
    int dp_colls;             /* data-parallel collectives the busiest rank issues a step
                                 (DDP's buckets, ZeRO's per segment) */
    double dp_predicted_s;    /* their seconds by the cost model, one after another */
    int ep_colls;             /* expert parallelism's all-to-alls the busiest rank runs a step */
    double ep_bytes;          /* the bytes of their rows it moves to other ranks */
    char algos[128];          /* "tp allreduce ring; dp allreduce rhd", ... */
    double fwd_s, bwd_s;      /* the busiest chunk's forward and backward of a micro-batch,
                                 products only */
    double compute_s;         /* the busiest rank's compute in the step */
    double optimizer_s;       /* its optimizer */
    double bubble_formula;    /* dt_pp_bubble_formula's idle share; 0 without pp */
    double step_s;            /* simulated */
    dt_sim_rank_stats slowest, mean; /* the rank that finished last; the average rank */
    int slowest_rank;
    double record_s, run_s;   /* wall time */
    long long events, messages;
} dt_sim_layout;

/* Whether the simulator can place the layout on `ranks` ranks: 0, or -1
 * with a message saying what would work (sizes that do not divide the
 * ranks, more stages than layers, a schedule that does not build). Sets
 * o->dp when 0. Whether the model splits as asked (tp's slices, cp's cut,
 * sequence parallelism's rows) is the trainer's check, which `dtrain
 * simulate` makes after this one. */
int dt_sim_layout_check(dt_sim_layout_opts *o, int ranks, char *err, size_t len);

/* Builds the step for every rank of w, runs it (span, when not NULL,
 * receives the timeline), fills out. 0, or -1 with a message. */
int dt_sim_layout_run(dt_sim_world *w, const dt_sim_layout_opts *o, dt_sim_span_fn span,
                      void *ctx, dt_sim_layout *out, char *err, size_t len);

#endif
