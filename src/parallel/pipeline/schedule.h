/* Pipeline-parallel schedules as data: for every rank, the list of actions
 * it runs in order in one training step, so an executor only walks a list
 * and a test can prove a schedule right without running a model.
 *
 * Placement: p ranks, V model chunks per rank, S = p * V stages; stage k
 * lives on rank k % p (rank r holds r, r + p, r + 2p, ..., as Megatron
 * interleaves), stage 0 holds the embedding and stage S - 1 the head. With
 * p >= 2 neighbouring stages are always on different ranks, so every edge
 * between stages is a message.
 *
 * Actions: F(k, i) forward of micro-batch i on stage k; B(k, i) its whole
 * backward, or, for zb1p, I(k, i) (gradient of the input) then W(k, i)
 * (gradient of the weights, free to run later). SEND_F(k, i) right after
 * F(k, i) (k < S - 1) hands the activation to stage k + 1, which posts
 * RECV_F(k + 1, i) just before its F; SEND_B(k, i) right after B/I(k, i)
 * (k > 0) hands the input gradient to stage k - 1, which posts
 * RECV_B(k - 1, i) just before its B/I. The stage of a send or receive is
 * always the one on the rank holding the action.
 *
 * What an executor must provide (and the check and simulation model): a
 * SEND never blocks (a nonblocking send), a RECV blocks until the peer has
 * issued the matching SEND, and each rank runs its list strictly in order.
 */
#ifndef DT_PARALLEL_PIPELINE_SCHEDULE_H
#define DT_PARALLEL_PIPELINE_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { DT_PP_NAIVE, DT_PP_GPIPE, DT_PP_1F1B, DT_PP_INTERLEAVED, DT_PP_ZB1P } dt_pp_kind;

typedef enum {
    DT_PP_F, DT_PP_B, DT_PP_I, DT_PP_W, /* compute; also the index into cost[] */
    DT_PP_SEND_F, DT_PP_RECV_F, DT_PP_SEND_B, DT_PP_RECV_B
} dt_pp_op;

typedef struct {
    uint8_t op;     /* a dt_pp_op */
    int16_t stage;  /* 0 .. S-1, always one of this rank's */
    int32_t micro;  /* 0 .. M-1 */
    int16_t peer;   /* the other rank of a send or receive, -1 otherwise */
} dt_pp_action;

typedef struct {
    dt_pp_kind kind;
    int p, V, M;
    int *n;               /* [p] actions of rank r */
    dt_pp_action **acts;  /* [p][n[r]] */
} dt_pp_schedule;

/* "naive", "gpipe", "1f1b", "interleaved", "zb1p". 0, or -1. */
int dt_pp_kind_parse(const char *name, dt_pp_kind *out);
const char *dt_pp_kind_name(dt_pp_kind k);

/* The schedule of one step:
 *  naive:       micro-batch i runs forward through every stage and back
 *               before i + 1 starts; one rank works at a time.
 *  gpipe:       every forward, then every backward, both in micro-batch
 *               order (PyTorch's ScheduleGPipe; the gradients then add up in
 *               the order one process adds them).
 *  1f1b:        rank r runs min(M, p-r-1) warm-up forwards, then one
 *               forward and one backward in turn, then the remaining
 *               backwards; at most min(M, p-r) activations held.
 *  interleaved: Megatron's depth-first interleaved 1F1B over V >= 2 chunks
 *               per rank, micro-batches in groups of p per chunk (so M must
 *               be a multiple of p); (p-r-1)*2 + (V-1)*p warm-up forwards
 *               (at most M*V), then 1F1B, then the remaining backwards.
 *  zb1p:        ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism",
 *               2023): 1f1b's forwards with each backward split into I and
 *               W; rank r runs each W r micro-batches after its I (in
 *               micro-batch order), so r W's are left for the end, where
 *               they fill 1f1b's cool-down. It holds
 *               min(M, p-r) micro-batches between F and I, as 1f1b does,
 *               and at most p between F and W; with F = I = W and M >= p
 *               every rank idles p-1 units, a third of 1f1b's bubble.
 * Refused, with a message saying what would work: p outside 2..64, M < 1,
 * V other than 1 for a kind other than interleaved, interleaved with V < 2
 * or M not a multiple of p, more than 32767 stages (p * V) or 2^20
 * micro-batch chunks (M * V).
 * 0, or -1 with err. */
int dt_pp_schedule_build(dt_pp_schedule *s, dt_pp_kind kind, int p, int V, int M, char *err,
                         size_t errlen);
/* The refusals of dt_pp_schedule_build alone, nothing built: what a run
 * would refuse. 0, or -1 with err. */
int dt_pp_schedule_valid(dt_pp_kind kind, int p, int V, int M, char *err, size_t errlen);
void dt_pp_schedule_free(dt_pp_schedule *s);

/* The static check, for schedules built here or by hand: every field in
 * range and every stage on its rank, every peer the rank of the
 * neighbouring stage; on each rank F after its RECV_F, B/I after its F and
 * its RECV_B, W after its I, a send after the compute it carries; every
 * (stage, micro) gets exactly one F and one B, or one I and one W; every
 * send has exactly one matching receive and the other way round; and
 * running the lists under the executor's rules above reaches every end (no
 * deadlock). 0, or -1 with a message naming the first problem (rank,
 * action index, what). */
int dt_pp_schedule_check(const dt_pp_schedule *s, char *err, size_t errlen);

typedef struct {
    int p;                /* ranks, the length of every array below */
    double makespan;      /* until the last rank finishes */
    double *busy, *idle;  /* [p] compute time, and makespan - busy */
    double idle_fraction; /* sum idle / (p * makespan) */
    int *peak_in_flight;  /* [p] most micro-batches (over all the rank's stages) whose F
                             has run and whose B or I has not */
    double **start;       /* [p][n[r]] when each action ran (a receive: once its
                             message was there) */
} dt_pp_sim;

/* Unit-time simulation of a schedule that passes the check: a compute
 * action takes cost[op] (indexed F, B, I, W), a send or receive no time; an
 * action starts when its rank is free and, for a RECV, once the peer has
 * issued the matching SEND. 0, or -1 with err (the check's message). */
int dt_pp_schedule_simulate(const dt_pp_schedule *s, const double cost[4], dt_pp_sim *out,
                            char *err, size_t errlen);
void dt_pp_sim_free(dt_pp_sim *sim);

/* The closed-form bubble of a kind, as idle / total time (a fraction of
 * p * makespan):
 *  naive:       (p-1)/p, every rank waits while the other p-1 work.
 *  gpipe, 1f1b: (p-1)/(M+p-1), the fill and drain of p-1 micro-batches.
 *  interleaved: the paper's bubble / ideal compute is x = (p-1)/(V*M),
 *               the fill shrunk V times by the smaller chunks;
 *               idle / total = x/(1+x).
 *  zb1p:        ZB-H1 with F = I = W: bubble (p-1)*(F+I-W) over ideal
 *               M*(F+I+W), x = (p-1)/(3M); idle / total = x/(1+x).
 * V is read by interleaved only. */
double dt_pp_bubble_formula(dt_pp_kind kind, int p, int V, int M);

/* A text chart of the unit-time simulation with F = 1, B = 2, I = W = 1:
 * a title line, then one row per rank, one column per unit of time, each
 * column the action's letter and micro-batch (and, when V > 1, "c" and the
 * chunk: F3c1) or '.' where the rank idles. The figures (the bubble, the
 * activations held) are left to the caller. */
void dt_pp_schedule_chart(FILE *f, const dt_pp_schedule *s);
/* The chart's costs, indexed F, B, I, W. */
extern const double dt_pp_chart_cost[4];

#endif
