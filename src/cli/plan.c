/*
 * `dtrain plan`: which layout fits a model on a cluster (cli/plan_layouts.c),
 * or a pipeline schedule drawn without training:
 *
 *   dtrain plan --pp N --grad-accum M [--pp-schedule KIND] [--pp-virtual V]
 *
 * Builds the per-rank action lists (parallel/pipeline/schedule.h), proves
 * them free of deadlock with the static check, and prints the unit-time
 * chart, then the step's figures: the bubble formula beside the simulated
 * idle fraction, and the activation slots each rank's list needs (the
 * executor's count, what `dtrain train` allocates). A long step is drawn
 * over a bounded number of micro-batches and its figures come from lists of
 * a bounded length (plan/pp_figures.h), so neither time nor memory grows
 * with M. The chart is in unit time, so `--pp-partition` (which layers a
 * stage runs) has no place here: it is refused with a message saying so.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

#include "core/parse.h"
#include "parallel/pipeline/schedule.h"
#include "plan/pp_figures.h"

void cli_plan_usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain plan --global-batch N --nodes N --ranks-per-node K --mem-per-rank GiB\n"
            "                   [--model NAME | --n-layer L --n-head H --n-embd C --vocab-size V]\n"
            "                   [--blocks SPEC]\n"
            "                   [--seq-len T] [--link-model M] [--tflops X] [--fp32] [--top K]\n"
            "                   [--json] [--tp N --cp N --pp N --zero-stage S --micro-batch B\n"
            "                    --recompute MODE --pp-schedule KIND]\n"
            "       dtrain plan --pp N --grad-accum M [--pp-schedule KIND] [--pp-virtual V]\n"
            "\n"
            "The first form weighs every layout of the model on the cluster; any of\n"
            "--global-batch, --nodes, --ranks-per-node, --mem-per-rank, --model, --n-layer,\n"
            "--link-model and --tflops picks it. The second draws a pipeline schedule. A\n"
            "flag takes its value as --flag value or as --flag=value.\n"
            "\n"
            "Layouts: tensor (tp), context (cp), data (dp) and pipeline (pp) parallel sizes,\n"
            "the ZeRO stage, the micro-batch and their count, the pipeline schedule and\n"
            "recomputation. Memory per rank by kind comes from the code that prints a run's\n"
            "memory table; step time from the compute rate and the cost model of the\n"
            "collectives over the real schedules. It prints the best layouts with their\n"
            "breakdown, why the others were dropped, and the courses' rule applied to the\n"
            "case; it exits 1 when no layout fits.\n"
            "\n");
    cli_plan_layouts_flags(f);
    fprintf(f,
            "\n"
            "A schedule: a chart, one row per rank and one column per unit of time (forward\n"
            "F = 1, backward B = 2, split backward I = W = 1; '.' idle), after checking that\n"
            "every send meets its receive without deadlock, then the bubble and the\n"
            "activations each rank holds (the slots `dtrain train` allocates from the rank's\n"
            "list). A step of more than max(2 p, 16) micro-batches is drawn over that many;\n"
            "its figures are the whole step's. Nothing is trained.\n"
            "\n"
            "  --pp N             pipeline ranks, 2..64\n"
            "  --grad-accum M     micro-batches per step (DeepSpeed's convention), 1..2^20\n"
            "  --pp-schedule KIND naive|gpipe|1f1b|interleaved|zb1p (default 1f1b)\n"
            "  --pp-virtual V     model chunks per rank, 1..64, for interleaved (default 2\n"
            "                     there, 1 otherwise)\n"
            "\n"
            "examples:\n"
            "  dtrain plan --model gpt2-xl --global-batch 512 --nodes 8 --ranks-per-node 8 \\\n"
            "      --mem-per-rank 80 --link-model nvlink-ib\n"
            "  dtrain plan --pp 4 --grad-accum 8 --pp-schedule 1f1b\n"
            "  dtrain plan --pp 4 --grad-accum 8 --pp-schedule interleaved --pp-virtual 2\n");
}

static int usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "dtrain plan: %s%s\nRun 'dtrain plan --help' for usage.\n", msg, arg);
    return CLI_EXIT_USAGE;
}

/* The layout form when any of its flags is there (cli/plan_layouts.c). */
static int wants_layouts(int argc, char **argv)
{
    static const char *flags[] = {"--global-batch", "--nodes", "--ranks-per-node",
                                  "--mem-per-rank", "--model", "--link-model", "--n-layer",
                                  "--tflops"};
    for (int i = 1; i < argc; i++) {
        char a[64];
        cli_flag_split(argv[i], a, sizeof a);
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
            if (!strcmp(a, flags[k])) return 1;
    }
    return 0;
}

typedef struct {
    long p, M, V;
    dt_pp_kind kind;
} chart_opts;

/* One flag and its value. 0, or the usage exit (message printed). */
static int chart_flag(chart_opts *o, const char *a, const char *v)
{
    if (!strcmp(a, "--pp")) {
        if (dt_parse_long(v, 2, 64, &o->p)) return usage_error("--pp takes 2..64, not ", v);
    } else if (!strcmp(a, "--grad-accum")) {
        if (dt_parse_long(v, 1, 1 << 20, &o->M))
            return usage_error("--grad-accum takes a count in 1..1048576, not ", v);
    } else if (!strcmp(a, "--pp-virtual")) {
        if (dt_parse_long(v, 1, 64, &o->V))
            return usage_error("--pp-virtual takes 1..64 (the chunks a run's rank holds), "
                               "not ", v);
    } else if (!strcmp(a, "--pp-schedule")) {
        if (dt_pp_kind_parse(v, &o->kind))
            return usage_error("--pp-schedule is one of naive|gpipe|1f1b|interleaved|zb1p, "
                               "not ", v);
    } else {
        return usage_error("unknown option ", a);
    }
    return 0;
}

/* 0, 1 after --help, or the usage exit. */
static int chart_parse(int argc, char **argv, chart_opts *o)
{
    *o = (chart_opts){.kind = DT_PP_1F1B};
    for (int i = 1; i < argc; i++) {
        char a[64];
        const char *eq = cli_flag_split(argv[i], a, sizeof a);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return cli_plan_usage(stdout), 1;
        if (!strcmp(a, "--pp-partition"))
            return usage_error("--pp-partition is not one of plan's options: the chart is in "
                               "unit time (F = 1, B = 2) whatever the layers cost, and which "
                               "layers each stage runs is chosen by `dtrain train --pp-partition`",
                               "");
        const char *v = cli_flag_value(argc, argv, &i, eq);
        if (!v) return usage_error("missing value after ", a);
        int rc = chart_flag(o, a, v);
        if (rc) return rc;
    }
    if (!o->p || !o->M)
        return usage_error("--pp and --grad-accum draw a schedule; a layout plan needs "
                           "--global-batch, --nodes, --ranks-per-node and --mem-per-rank", "");
    if (!o->V) o->V = o->kind == DT_PP_INTERLEAVED ? 2 : 1;
    return 0;
}

/* Micro-batches drawn: all of a short step; of a long one enough for its
 * fill, some steady state and its drain (a multiple of p for interleaved). */
static int drawn(const chart_opts *o)
{
    long most = 2 * o->p > 16 ? 2 * o->p : 16;
    if (o->kind == DT_PP_INTERLEAVED) most -= most % o->p;
    return (int)(o->M < most ? o->M : most);
}

static void figures_footer(const chart_opts *o, const dt_plan_pp_figures *g)
{
    const int p = (int)o->p, step = o->kind == DT_PP_INTERLEAVED ? p : 1;
    if (g->from)
        printf("figures of the whole step's %ld micro-batches: from %d on, each %d more add "
               "the same time and slots (the lists of %d, %d and %d show it), so these extend "
               "those of %d\n", o->M, g->from, step, g->from, g->from + step,
               g->from + 2 * step, g->from);
    printf("bubble (idle / total): formula %.4g, simulated %.4g over makespan %.0f\n",
           dt_pp_bubble_formula(o->kind, p, (int)o->V, (int)o->M), g->idle_fraction,
           g->makespan);
    printf("activations held (the slots `dtrain train` allocates from each rank's list):");
    for (int r = 0; r < p; r++) printf(" rank %d: %d%s", r, g->slots[r], r + 1 < p ? "," : "\n");
}

static int chart(const chart_opts *o)
{
    char err[512];
    dt_plan_pp_figures g;
    dt_pp_schedule s;
    const int p = (int)o->p, V = (int)o->V, M = (int)o->M, D = drawn(o);
    if (dt_plan_pp_figures_of(o->kind, p, V, M, dt_pp_chart_cost, &g, err, sizeof err)) {
        fprintf(stderr, "dtrain plan: %s\n", err);
        return CLI_EXIT_USAGE;
    }
    if (dt_pp_schedule_build(&s, o->kind, p, V, D, err, sizeof err)) {
        fprintf(stderr, "dtrain plan: %s\n", err);
        return 1;
    }
    int rc = dt_pp_schedule_check(&s, err, sizeof err);
    if (rc) {
        fprintf(stderr, "dtrain plan: the schedule fails its check (a bug): %s\n", err);
    } else {
        if (D < M)
            printf("drawn: %d of the step's %d micro-batches (all of them would take %.0f "
                   "columns)\n", D, M, g.makespan);
        dt_pp_schedule_chart(stdout, &s);
        figures_footer(o, &g);
    }
    dt_pp_schedule_free(&s);
    return rc ? 1 : 0;
}

int cli_plan(int argc, char **argv)
{
    if (wants_layouts(argc, argv)) return cli_plan_layouts(argc, argv);
    chart_opts o;
    int rc = chart_parse(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    return chart(&o);
}
