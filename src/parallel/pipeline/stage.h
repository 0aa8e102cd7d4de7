/* What one rank of a pipeline holds, by arithmetic over the layout and the
 * schedule (no buffer): its ranges of the flat layout, and the memory
 * they and its activation slots take. The strategy holds what these say,
 * and the memory plan (train/memory/plan_pp.h) prints them, so the two
 * cannot drift apart.
 *
 * Rank q of p (V chunks each, S = p V stages; stage k on rank k % p)
 * holds the segments of its stages' layers, the embeddings when it has
 * stage 0 and, as the tied head, when it has stage S - 1, and ln_f with
 * stage S - 1. Psi_q is the floats those ranges cover, the layout's
 * 64-byte tensor alignment included (what the buffers hold: gpt.h).
 *
 * Its activations: the slots its action list holds at once
 * (executor.h's dt_pp_exec_slots), carved by the model with the arena's
 * shared part (dt_gpt_slots_floats: backward's scratch, the recompute
 * mode's rebuilt layer; zb1p's split backward keeps more per slot), and
 * per slot the executor's own: the micro-batch's tokens and targets
 * (int32, N = B T each) and the output gradient it receives (N C fp32). */
#ifndef DT_PARALLEL_PIPELINE_STAGE_H
#define DT_PARALLEL_PIPELINE_STAGE_H

#include <stddef.h>

#include "model/gpt.h"
#include "model/ranges.h"
#include "parallel/pipeline/schedule.h"

#define DT_PP_MAX_RANGES 130 /* a range per chunk (V <= 64), the tied copy, ln_f */

/* Rank q's ranges of the flat layout into r[DT_PP_MAX_RANGES], ascending,
 * adjacent ones merged, packed end to end (`at`) for the optimizer's
 * state; len is Psi_q. cut[S + 1] (partition.h). */
dt_flat_ranges dt_pp_held_ranges(const dt_gpt *m, const int *cut, int p, int V, int q,
                                 dt_flat_range *r);

typedef struct {
    size_t floats;      /* Psi_q: of parameters, gradients, optimizer state */
    size_t in_use;      /* the most of them in use at once: a layer's segment, the
                           embeddings, or the head's ln_f with the tied copy (mixed
                           precision widens these into fp32) */
    size_t grads_open;  /* the most whose gradients backward holds open at once (bf16
                           accumulation adds in fp32 there): those in use (zb1p's halves
                           each close what they opened) */
    int slots;          /* micro-batches in flight */
    size_t model_floats; /* the model's activation arena for them (4 bytes each) */
    size_t exec_bytes;  /* the executor's buffers for them */
    double acts;        /* bytes: 4 model_floats + exec_bytes */
} dt_pp_stage_mem;

/* Rank q's holdings for schedule s (kind, p, V, M) cut by cut, micro-batches
 * of B x T, on a layout whose recompute mode is the run's (split_backward
 * is taken from the schedule: zb1p). 0, or -1 (out of memory, or a
 * schedule with more than 64 chunks). */
int dt_pp_stage_memory(const dt_gpt *layout, const dt_pp_schedule *s, const int *cut, int q,
                       int B, int T, dt_pp_stage_mem *out);

/* Its two halves, for the tensor slices of one stage, which share the
 * slots: rank q's slots (executor.h's dt_pp_exec_slots), their parts in
 * *parts (malloc'd; the caller frees them), the count, or -1; then the
 * holdings of layout (a slice's) with those slots. */
int dt_pp_stage_slots(const dt_pp_schedule *s, const int *cut, int q, dt_gpt_part **parts);
void dt_pp_stage_memory_of(const dt_gpt *layout, const dt_pp_schedule *s, const int *cut, int q,
                           int B, int T, int slots, const dt_gpt_part *parts,
                           dt_pp_stage_mem *out);

#endif
