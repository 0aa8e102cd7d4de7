/* The courses' rule of thumb on the case at hand: "if a single layer does
 * not fit, tensor parallelism; else if the model does not fit, pipeline
 * parallelism; else data parallelism", with the sizes that decide it, and
 * how the planner's best compares with the best layout the rule allows.
 * See plan.h. */
#include <string.h>

#include "core/str.h"
#include "plan/plan.h"
#include "train/memory/plan.h"

#define GIB(x) ((double)(x) / (1024.0 * 1024.0 * 1024.0))

/* Model-state bytes a parameter unsharded (P + G + K) for the case. */
static double state_bytes(const dt_plan_input *in)
{
    return in->bf16 ? 2 + 2 + 12 : 4 + 4 + 8;
}

/* Which of the rule's answers a layout is: 't' splits layers, 'p' splits
 * the model into stages, 'd' is data parallelism alone (ZeRO included). */
static char kind_of(const dt_plan_layout *l)
{
    if (l->tp > 1) return 't';
    if (l->pp > 1) return 'p';
    return 'd';
}

static const dt_plan_row *best_of(const dt_plan_result *r, char kind)
{
    for (int i = 0; i < r->nfit; i++)
        if (kind_of(&r->rows[i].l) == kind) return &r->rows[i];
    return NULL;
}

/* Where the rule's layout loses the most time against the planner's best:
 * the rule asks what fits, not what is fastest. */
static void why_faster(FILE *f, const dt_plan_row *rule, const dt_plan_row *best)
{
    static const char *what[] = {"the products (at the slowest stage's pace)",
                                 "the pipeline's bubble", "the wait for a shared core",
                                 "tensor parallelism's reduces", "context parallelism's exchange",
                                 "the stage boundaries' messages",
                                 "data parallelism's reductions and gathers", "the optimizer"};
    const double a[] = {rule->compute, rule->bubble, rule->cores_s, rule->tp_s, rule->cp_s,
                        rule->pp_s, rule->dp_s, rule->opt_s};
    const double b[] = {best->compute, best->bubble, best->cores_s, best->tp_s, best->cp_s,
                        best->pp_s, best->dp_s, best->opt_s};
    int k = 0;
    for (int i = 1; i < 8; i++)
        if (a[i] - b[i] > a[k] - b[k]) k = i;
    fprintf(f, "  the rule asks what fits, not what is fastest: most of the difference is %s, "
            "%.1f ms a step against %.1f\n", what[k], a[k] * 1e3, b[k] * 1e3);
}

void dt_plan_rule(FILE *f, const dt_plan_input *in, const dt_plan_result *r)
{
    const dt_gpt_config *m = &in->model;
    const double K = state_bytes(in), layer_psi = (double)dt_gpt_layer_param_count(m);
    const double layer = layer_psi * K + (double)dt_gpt_config_layer_act_bytes(m, 1, in->T);
    const double model = (double)dt_gpt_param_count(m) * K;
    char why;
    fprintf(f, "\nthe rule (\"a layer does not fit: tensor parallel; else the model does not "
            "fit: pipeline; else data parallel\") on this case:\n");
    fprintf(f, "  one layer: %.3g M parameters x %.0f bytes + its activations at one sequence "
            "= %.2f GiB: %s a rank's %.1f GiB\n", layer_psi / 1e6, K, GIB(layer),
            layer <= in->mem ? "fits" : "does not fit", GIB(in->mem));
    if (layer > in->mem) {
        why = 't';
    } else {
        const double psi = (double)dt_gpt_param_count(m);
        fprintf(f, "  the model's state: %.3g %s parameters x %.0f bytes = %.1f GiB: %s\n",
                psi >= 1e9 ? psi / 1e9 : psi / 1e6, psi >= 1e9 ? "B" : "M", K, GIB(model),
                model <= in->mem ? "fits (activations aside)" : "does not fit");
        why = model > in->mem ? 'p' : 'd';
    }
    static const char *answer[] = {"tensor parallelism", "pipeline parallelism",
                                   "data parallelism"};
    const int a = why == 't' ? 0 : why == 'p' ? 1 : 2;
    fprintf(f, "  so the rule says %s", answer[a]);
    const dt_plan_row *rule = best_of(r, why), *best = r->nfit ? &r->rows[0] : NULL;
    if (!best) {
        fprintf(f, "; nothing fits here at all\n");
        return;
    }
    char name[160];
    if (!rule) {
        fprintf(f, ", and no layout of that kind fits: ");
    } else if (rule == best) {
        fprintf(f, ", and the planner agrees: its best is of that kind\n");
        return;
    } else {
        dt_plan_layout_name(&rule->l, name, sizeof name);
        fprintf(f, "; its best here is %s at %.1f ms a step, ", name, rule->step * 1e3);
    }
    dt_plan_layout_name(&best->l, name, sizeof name);
    fprintf(f, "the planner's best is %s at %.1f ms\n", name, best->step * 1e3);
    if (rule) why_faster(f, rule, best);
}
