/* What each stage of a pipeline (--pp) should hold, so that `dtrain train
 * --dry-run --pp N` can say it without building the model, and a run can
 * print it beside what each rank measured. Pure arithmetic over the
 * layout: it allocates no model buffer.
 *
 * Stage q (pipeline rank q; with --pp-virtual its chunks) holds Psi_q
 * floats of the flat layout whole (parallel/pipeline/stage.h: its layers'
 * segments, the embeddings V C + T C on stage 0 and, as the tied head,
 * on the last, ln_f's 2 C on the last; a layer its kinds' parameters,
 * GPT-2's 12 C^2 + 13 C; the
 * 64-byte tensor alignment included, as the buffers hold it). Each of a
 * stage's data-parallel copies (DDP within the stage) holds the same, in
 * bytes:
 *
 *     params P Psi_q     grads G Psi_q     optimizer state K Psi_q
 *
 * with P, G and K of memory/plan.h at stage 0 (fp32: 4, 4, 8 for Adam;
 * bf16 mixed precision: 2, 4 or 2 with bf16 accumulation, 12; SGD: K = 4
 * with momentum, 0 without, plus 4 in bf16).
 *
 * Activations, 4 bytes a float: the stage's micro-batches in flight (the
 * slots its schedule's action list holds at once) times one micro-batch
 * of its layers (with the embeddings' output, or the head's final
 * LayerNorm, logits and losses; zb1p's split backward keeps more), plus
 * what every slot shares (backward's scratch, the recompute mode's
 * rebuilt layer), plus per slot the executor's tokens and targets (int32)
 * and received output gradient (N C).
 *
 * Transient, beyond the formula, with mixed precision: the segments in use
 * widened into fp32 (a layer, the embeddings, or the head's ln_f with the
 * tied copy), and with bf16 accumulation their fp32 gradients. */
#ifndef DT_TRAIN_MEMORY_PLAN_PP_H
#define DT_TRAIN_MEMORY_PLAN_PP_H

#include <stdio.h>

#include "parallel/places.h"
#include "train/memory/plan.h"

/* The plan of a rank that holds `held->floats` of the layout (a pipeline
 * stage, a tensor-parallel rank's slices): memory/plan.h's P, G and K
 * over them (psi = Psi_q), divided by `ranks` as the ZeRO stage says (the
 * optimizer state at stage 1; gradients, parameters and their transient
 * windows at 2 and 3, as for the whole model, layout being the rank's
 * own), its activations as given, the transient windows of its segments
 * in use. floats 0: the whole model, memory/plan.h's plan over `ranks`.
 * 0, or -1 with err. */
int dt_mem_plan_held(const dt_gpt *layout, const dt_train_config *c, int ranks,
                     const dt_rank_mem *held, dt_mem_plan *p, char *err, size_t errlen);

/* Under a rank's line of the memory table: its plan's figures, each with
 * the measured one's ratio to it (snap: DT_MEM_SNAPSHOT values), then the
 * transient windows, if any. */
void dt_mem_plan_held_print(FILE *f, const dt_mem_plan *p, const unsigned long long *snap);

/* Above the table's rows: the formulas the plans use. */
void dt_mem_plan_held_heading(FILE *f, const dt_mem_plan *p, const char *who);

/* The table of a pipeline's stages (pl->pipe, its places in order, each
 * with its plan in plan[]): a heading naming the setting (layout: the whole
 * model's, its recompute mode the run's), the formulas, then one row per
 * stage (its layers, Psi_q, micro-batches in flight, params, grads, optim,
 * model state, acts and total in MiB), and the transient windows. */
void dt_mem_plan_pp_print(FILE *f, const dt_gpt *layout, const dt_places *pl,
                          const dt_mem_plan *plan, const char *title);

#endif
