/* The tables of a pipeline's per-stage plan: `--dry-run --pp`'s, and a
 * run's rows beside what each rank measured. See memory/plan_pp.h. */
#include <string.h>

#include "core/str.h"
#include "train/memory/plan_pp.h"

#define MIB(x) ((double)(x) / 1048576.0)
#define COL "%-16s"

static const dt_mem_kind shown[] = {DT_MEM_PARAMS, DT_MEM_GRADS, DT_MEM_OPTIM};

static const char *prec_name(const dt_mem_plan *p)
{
    return p->o.prec == DT_PREC_BF16 ? "bf16 mixed precision" : "fp32";
}

/* ZeRO-1 splits each stage's optimizer state over its data-parallel ranks. */
static int zero1(const dt_mem_plan *p) { return p->o.zero_stage == 1 && p->o.ranks > 1; }

/* Model state's formula: "16 Psi_q", or with ZeRO-1 "(8 + 8/N) Psi_q". */
static void state_formula(const dt_mem_plan *p, char *buf, size_t n)
{
    if (zero1(p))
        dt_strf(buf, n, "(%d + %d/N) Psi_q", p->param_bytes + p->grad_bytes, p->optim_bytes);
    else dt_strf(buf, n, "%d Psi_q", p->param_bytes + p->grad_bytes + p->optim_bytes);
}

/* The transient windows of one plan, after `lead`; nothing without any. */
static void print_windows(FILE *f, const dt_mem_plan *p, const char *lead)
{
    if (p->window_widened <= 0 && p->window_grads <= 0) return;
    fprintf(f, "%stransient, beyond the plan:", lead);
    if (p->window_widened > 0)
        fprintf(f, " parameters widened to fp32 while in use (a layer, the embeddings, or "
                "ln_f with the tied copy), at most %.1f MiB;", MIB(p->window_widened));
    if (p->window_grads > 0)
        fprintf(f, " fp32 gradients of the segments backward holds open, at most %.1f MiB;",
                MIB(p->window_grads));
    fprintf(f, " not planned: the matrix products' bf16 copies of their operands (per "
            "thread, counted in acts)\n");
}

/* ---- a run's table -------------------------------------------------------- */

void dt_mem_plan_held_heading(FILE *f, const dt_mem_plan *p, const char *who)
{
    fprintf(f, "  plan per %s: params %s | grads %s | optim %s (%s, %s: K = %d "
            "bytes/parameter; Psi_q the floats it holds) | acts its micro-batches in flight "
            "and what they share; beside each planned figure, measured / planned\n", who,
            p->formula[DT_MEM_PARAMS], p->formula[DT_MEM_GRADS], p->formula[DT_MEM_OPTIM],
            prec_name(p), dt_opt_kind_name(p->o.opt), p->optim_bytes);
}

/* "params 0.5 MiB x1.0000": the planned figure, and the measured one's ratio. */
static void cell(FILE *f, const char *name, double planned, double measured, const char *sep)
{
    if (planned > 0)
        fprintf(f, "%s %.1f MiB x%.4f%s", name, MIB(planned), measured / planned, sep);
    else
        fprintf(f, "%s 0 MiB (measured %.1f)%s", name, MIB(measured), sep);
}

void dt_mem_plan_held_print(FILE *f, const dt_mem_plan *p, const unsigned long long *snap)
{
    double state = 0, planned = 0;
    fprintf(f, "    plan, Psi_q = %zu: ", p->psi);
    for (size_t i = 0; i < 3; i++) {
        cell(f, dt_mem_kind_name(shown[i]), p->bytes[shown[i]], (double)snap[shown[i]], " | ");
        state += (double)snap[shown[i]];
        planned += p->bytes[shown[i]];
    }
    cell(f, "acts", p->bytes[DT_MEM_ACTS], (double)snap[DT_MEM_ACTS], " | ");
    cell(f, "state + acts", planned + p->bytes[DT_MEM_ACTS], state + (double)snap[DT_MEM_ACTS],
         "\n");
    print_windows(f, p, "      ");
}

/* ---- --dry-run's table ---------------------------------------------------- */

/* The stages, their plans and the model, as the table reads them. */
typedef struct {
    const dt_places *pl;
    const dt_places_pipe *pp;
    const dt_mem_plan *stage; /* [pl->n] */
    size_t psi;               /* the model's parameters */
    dt_recompute recompute;
} stages;

static void print_setting(FILE *f, const stages *p, const char *title)
{
    const dt_mem_plan *s = &p->stage[0];
    static const char *const parts[] = {"uniform", "params", "cost"};
    fprintf(f, "%s: Psi = %zu parameters, %s, %s (K = %d bytes/parameter), pipeline of %d "
            "stages over %d ranks (%s, M = %d micro-batches, partition %s), micro-batch "
            "%d x %d\n", title, p->psi, prec_name(s),
            dt_opt_kind_name(s->o.opt), s->optim_bytes, p->pp->p * p->pp->V,
            p->pp->p * p->pp->dp, dt_pp_kind_name(p->pp->kind), p->pp->M, parts[p->pp->part],
            s->o.B, s->o.T);
    fprintf(f, "  Psi_q: the floats a stage holds: its layers (12 C^2 + 13 C each with GPT-2's "
            "blocks), the "
            "embeddings (V C + T C) on stage 0 and, tied, on the last with ln_f (2 C); "
            "64-byte tensor alignment included\n");
    if (zero1(s))
        fprintf(f, "  a row is each rank of that stage: its N = %d data-parallel ranks (ZeRO-1 "
                "within the stage) hold the same parameters and gradients, and 1/N of the "
                "optimizer state each\n", p->pp->dp);
    else
        fprintf(f, "  a row is each rank of that stage: its N = %d data-parallel cop%s (DDP "
                "within the stage) hold%s the same\n", p->pp->dp, p->pp->dp == 1 ? "y" : "ies",
                p->pp->dp == 1 ? "s" : "");
}

static void print_columns(FILE *f, const stages *p)
{
    const dt_mem_plan *s = &p->stage[0];
    char state[24];
    state_formula(s, state, sizeof state);
    fprintf(f, "  %-8s%-12s%-13s%-11s", p->pp->V > 1 ? "rank" : "stage", "layers", "Psi_q",
            "in flight");
    for (size_t i = 0; i < 3; i++) fprintf(f, COL, dt_mem_kind_name(shown[i]));
    fprintf(f, COL COL "%s\n", "model state", "acts", "total");
    fprintf(f, "  %-44s", "formula");
    for (size_t i = 0; i < 3; i++) fprintf(f, COL, s->formula[shown[i]]);
    fprintf(f, COL COL "%s\n", state, s->formula[DT_MEM_ACTS], "state + acts");
}

static void print_stage(FILE *f, const stages *p, int q)
{
    const dt_mem_plan *s = &p->stage[q];
    const dt_place *at = &p->pl->at[q];
    fprintf(f, "  %-8d%-12s%-13zu%-11d", q, at->layers, s->psi, at->in_flight);
    for (size_t i = 0; i < 3; i++) fprintf(f, "%-16.1f", MIB(s->bytes[shown[i]]));
    double state = dt_mem_plan_state(s), acts = s->bytes[DT_MEM_ACTS];
    fprintf(f, "%-16.1f%-16.1f%.1f MiB\n", MIB(state), MIB(acts), MIB(state + acts));
}

/* " 0.2 / 0.3 MiB on stages 0 / 1": a window of every stage. */
static void per_stage(FILE *f, const stages *p, int grads)
{
    for (int q = 0; q < p->pl->n; q++)
        fprintf(f, "%s%.1f", q ? " / " : " ", MIB(grads ? p->stage[q].window_grads
                                                         : p->stage[q].window_widened));
    fprintf(f, " MiB on %s", p->pp->V > 1 ? "ranks" : "stages");
    for (int q = 0; q < p->pl->n; q++) fprintf(f, "%s%d", q ? " / " : " ", q);
}

/* Mixed precision's windows, each stage's, in one line. */
static void print_stage_windows(FILE *f, const stages *p)
{
    const dt_mem_plan *s = &p->stage[0];
    if (s->window_widened <= 0 && s->window_grads <= 0) return;
    fprintf(f, "  transient, beyond the formula: parameters widened to fp32 while in use (a "
            "layer, the embeddings, or ln_f with the tied copy), at most");
    per_stage(f, p, 0);
    if (s->window_grads > 0) {
        fprintf(f, "; fp32 gradients of the segments backward holds open, at most");
        per_stage(f, p, 1);
    }
    fprintf(f, "; not planned: the matrix products' bf16 copies of their operands (per "
            "thread, counted in acts)\n");
}

void dt_mem_plan_pp_print(FILE *f, const dt_gpt *layout, const dt_places *pl,
                          const dt_mem_plan *plan, const char *title)
{
    const stages p = {pl, &pl->pipe, plan, dt_gpt_param_count(&layout->cfg),
                      layout->acts.recompute};
    print_setting(f, &p, title);
    print_columns(f, &p);
    for (int q = 0; q < pl->n; q++) print_stage(f, &p, q);
    fprintf(f, "  acts: per micro-batch in flight, the stage's activations (recompute %s%s) "
            "and the executor's tokens, targets and received gradient; shared by them, "
            "backward's scratch%s\n", dt_recompute_name(p.recompute),
            pl->pipe.kind == DT_PP_ZB1P ? ", split backward" : "",
            p.recompute != DT_RECOMPUTE_NONE ? " and the rebuilt layer" : "");
    print_stage_windows(f, &p);
}
