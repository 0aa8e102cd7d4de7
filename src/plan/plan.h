/* `dtrain plan`: which layout should train this model on this cluster.
 *
 * It enumerates layouts (tp, cp, dp, pp, the ZeRO stage, the micro-batch
 * and their count, the pipeline schedule, recomputation: layouts.c),
 * predicts each one's memory per rank by kind with the code behind
 * `dtrain train --dry-run` (the ddp kind's places: memory.c) and its step
 * time from the compute rate and the cost model of the collectives over
 * the real schedules (the pipeline's action lists simulated in time, each
 * collective's algorithm run dry on a stand-in of its group: step_time.c),
 * drops what does not fit with the reason, and ranks the rest (report.c),
 * with the courses' rule ("a layer does not fit: tensor parallelism; the
 * model does not fit: pipeline; else data parallelism") applied to the
 * case as the explanation (rule.c).
 *
 * Nothing is allocated at the model's size and no rank is started: it is
 * arithmetic over layouts (tensor tables) and dry runs. */
#ifndef DT_PLAN_PLAN_H
#define DT_PLAN_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "comm/cost/model.h"
#include "core/alloc.h"
#include "model/gpt.h"
#include "parallel/pipeline/schedule.h"

typedef struct {
    dt_gpt_config model;
    char model_name[32];
    int T;                /* sequence length */
    long batch;           /* global batch, in sequences */
    int nodes, per_node;  /* ranks = nodes x per_node, per_node to a host */
    double mem;           /* bytes of memory per rank */
    dt_cost_model links;  /* the collectives' cost model: shm within a host, tcp between */
    double flops;         /* sustained FLOP/s of a rank's matrix products, on its own */
    int cores;            /* > 0: a host's per_node ranks take turns on this many cores
                           * (oversubscribed: more ranks than cores); 0: each its own */
    int cpu_comm;         /* the collectives run on the ranks' own cores (a CPU host with
                           * none to spare): they add to the compute, not hide behind it */
    char flops_source[160]; /* where that figure comes from */
    double opt_Bps;       /* bytes/s a rank's optimizer streams its state at */
    int bf16;             /* mixed precision: bf16 weights and activations, fp32 masters */
    int max_tp;           /* 0: the ranks of a host */
    double moe_skew;      /* a mixture of experts: the busiest expert-parallel rank's rows
                           * over the mean (an assumption; 1: a balanced router) */
    /* Sizes and modes the user fixed (--tp, --zero-stage ...): only
     * layouts with them are weighed; -1: free. */
    struct {
        int tp, cp, pp, zero, B, rc, sched, ep;
    } pin;
    int show;             /* the dropped layouts the report shows (--top): only these of
                           * them are timed */
    /* Told before each layout is weighed (done of total), or NULL: a long
     * plan can say how far it is. */
    void (*progress)(void *arg, long done, long total);
    void *progress_arg;
} dt_plan_input;

/* The most ranks a plan weighs: what a dtrain job starts (its bootstrap)
 * and the collectives' cost model stands in for (sim/world.h). */
#define DT_PLAN_MAX_RANKS (1 << 20)

/* One layout: sizes, the batch's shape and the modes. */
typedef struct {
    int tp, cp, dp, pp, V;  /* V: model chunks per rank (interleaved) */
    int ep;                 /* expert-parallel ranks, consecutive data-parallel ones */
    int B, M;               /* micro-batch sequences, micro-batches per step */
    int zero;               /* 0-3 */
    int sp;                 /* sequence parallelism (with tp) */
    dt_pp_kind sched;       /* with pp > 1 */
    dt_recompute rc;
} dt_plan_layout;

/* Its predictions. */
typedef struct {
    dt_plan_layout l;
    double mem[DT_MEM_KIND_COUNT]; /* bytes by kind, of the rank that holds the most */
    double mem_total;              /* its model state and activations */
    size_t psi;                    /* floats of the model that rank holds (its stage's, its
                                    * slices), before ZeRO divides them */
    /* seconds a step: the products, the pipeline's bubble or, on a host
     * with more ranks than cores, the wait for a core (the bubble's idle
     * ranks then hand theirs over), the exposed communication of each
     * kind, the optimizer, the sum */
    double compute, bubble, cores_s, tp_s, cp_s, pp_s, dp_s, opt_s, step;
    double ep_s;                   /* the experts' dispatch and combine all-to-alls */
    double ep_bytes;               /* what the busiest ep rank's all-to-alls carry to or
                                    * from other ranks in a step */
    double tokens_per_s;
    int fits;
    char why[200]; /* why it was dropped */
} dt_plan_row;

typedef struct {
    dt_plan_row *rows; /* fitting first, fastest first; then the dropped (the first
                        * in->show of them timed, the rest with no step time) */
    int n, nfit;
    long considered;   /* layouts enumerated */
    double seconds;    /* the planner's own time */
} dt_plan_result;

/* The layouts of in (layouts.c): every combination whose sizes divide,
 * the heads, layers, sequence and batch as a run would require. *out is
 * malloc'd. 0, or -1 with err. */
int dt_plan_layouts(const dt_plan_input *in, dt_plan_layout **out, int *n, char *err,
                    size_t errlen);

/* What the planner works out once and asks again (plan_internal.h): the
 * collectives' seconds, the schedules' makespans, the last layout's
 * holdings. */
typedef struct dt_plan_memo dt_plan_memo;
int dt_plan_memo_open(dt_plan_memo **c, const dt_plan_input *in, char *err, size_t errlen);
void dt_plan_memo_close(dt_plan_memo *c);

/* Memory per rank of layout l (memory.c): fills row's mem, mem_total, psi
 * and fits (against in->mem, with why). 0, or -1 with err. */
int dt_plan_memory(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l,
                   dt_plan_row *row, char *err, size_t errlen);

/* Step time of layout l (step_time.c): row's seconds and tokens_per_s
 * (row->psi from dt_plan_memory first). 0, or -1 with err. */
int dt_plan_time(const dt_plan_input *in, dt_plan_memo *c, const dt_plan_layout *l,
                 dt_plan_row *row, char *err, size_t errlen);

/* The compute of link preset `links`'s GPU class (compute.c): half its bf16
 * dense peak and half its memory rate, with where they come from; 1, or 0
 * when the name is no GPU preset (then nothing is written). */
int dt_plan_gpu(const char *links, double *flops, double *opt_Bps, char *source, size_t n);

/* The sustained FLOP/s of one layer forward and backward at one sequence
 * of T, or DT_PLAN_MEASURE_T tokens when T is longer, on `threads` threads
 * here (compute.c; kernels/ as a run uses them): what this host's ranks
 * compute at. A throwaway model of 3 layers of the model's width with a
 * small vocabulary runs it. 0, or -1 with err. */
#define DT_PLAN_MEASURE_T 256
int dt_plan_measure_flops(const dt_gpt_config *m, int T, int bf16, int threads, double *flops,
                          char *err, size_t n);
/* What that measurement costs before it runs: the tokens of its sequence,
 * about the bytes it holds and the FLOPs of its passes. */
void dt_plan_measure_cost(const dt_gpt_config *m, int T, int *tokens, double *bytes,
                          double *flops);

/* All of it: 0, or -1 with err. */
int dt_plan_run(const dt_plan_input *in, dt_plan_result *out, char *err, size_t errlen);
void dt_plan_result_free(dt_plan_result *r);

/* "tp 2 x cp 1 x dp 4 x pp 2, ZeRO-1, micro-batch 2 x 8, 1f1b, recompute none". */
void dt_plan_layout_name(const dt_plan_layout *l, char *buf, size_t n);

/* The report (report.c): the best `top` with their breakdown, a count of
 * the dropped by reason with an example each, and the rule (rule.c). */
void dt_plan_print(FILE *f, const dt_plan_input *in, const dt_plan_result *r, int top);
int dt_plan_print_json(FILE *f, const dt_plan_input *in, const dt_plan_result *r, int top);
/* The courses' rule on this case, a few lines. */
void dt_plan_rule(FILE *f, const dt_plan_input *in, const dt_plan_result *r);

#endif
