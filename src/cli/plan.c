/*
 * `dtrain plan`: a pipeline schedule drawn without training.
 *
 *   dtrain plan --pp N --grad-accum M [--pp-schedule KIND] [--pp-virtual V]
 *
 * Builds the per-rank action lists (parallel/pipeline/schedule.h), proves
 * them free of deadlock with the static check, and prints the unit-time
 * chart with the bubble formula beside the simulated idle fraction and the
 * activations each rank holds at most. The chart is in unit time, so
 * `--pp-partition` (which layers a stage runs) has no place here: it is
 * refused with a message saying so.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

#include "core/parse.h"
#include "parallel/pipeline/schedule.h"

static void plan_usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain plan --pp N --grad-accum M [--pp-schedule KIND] [--pp-virtual V]\n"
            "\n"
            "Prints a pipeline schedule as a chart, one row per rank and one column per\n"
            "unit of time (forward F = 1, backward B = 2, split backward I = W = 1; '.'\n"
            "idle), after checking that every send meets its receive without deadlock.\n"
            "Nothing is trained.\n"
            "\n"
            "  --pp N             pipeline ranks, 2..64\n"
            "  --grad-accum M     micro-batches per step (DeepSpeed's convention)\n"
            "  --pp-schedule KIND naive|gpipe|1f1b|interleaved|zb1p (default 1f1b)\n"
            "  --pp-virtual V     model chunks per rank, for interleaved (default 2 there,\n"
            "                     1 otherwise)\n"
            "\n"
            "examples:\n"
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
    for (int i = 1; i < argc; i++)
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
            if (!strcmp(argv[i], flags[k])) return 1;
    return 0;
}

int cli_plan(int argc, char **argv)
{
    if (wants_layouts(argc, argv)) return cli_plan_layouts(argc, argv);
    long p = 0, M = 0, V = 0;
    dt_pp_kind kind = DT_PP_1F1B;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            plan_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--pp-partition"))
            return usage_error("--pp-partition is not one of plan's options: the chart is in "
                               "unit time (F = 1, B = 2) whatever the layers cost, and which "
                               "layers each stage runs is chosen by `dtrain train --pp-partition`",
                               "");
        if (!v) return usage_error("missing value after ", a);
        if (!strcmp(a, "--pp")) {
            if (dt_parse_long(v, 2, 64, &p)) return usage_error("--pp takes 2..64, not ", v);
        } else if (!strcmp(a, "--grad-accum")) {
            if (dt_parse_long(v, 1, 1 << 20, &M))
                return usage_error("--grad-accum takes a count >= 1, not ", v);
        } else if (!strcmp(a, "--pp-virtual")) {
            if (dt_parse_long(v, 1, 32767, &V))
                return usage_error("--pp-virtual takes >= 1, not ", v);
        } else if (!strcmp(a, "--pp-schedule")) {
            if (dt_pp_kind_parse(v, &kind))
                return usage_error("--pp-schedule is one of naive|gpipe|1f1b|interleaved|zb1p, "
                                   "not ", v);
        } else {
            return usage_error("unknown option ", a);
        }
        i++;
    }
    if (!p || !M) return usage_error("--pp and --grad-accum are needed", "");
    if (!V) V = kind == DT_PP_INTERLEAVED ? 2 : 1;
    char err[512];
    dt_pp_schedule s;
    if (dt_pp_schedule_build(&s, kind, (int)p, (int)V, (int)M, err, sizeof err)) {
        fprintf(stderr, "dtrain plan: %s\n", err);
        return CLI_EXIT_USAGE;
    }
    int rc = dt_pp_schedule_check(&s, err, sizeof err);
    if (rc) {
        fprintf(stderr, "dtrain plan: the schedule fails its check (a bug): %s\n", err);
    } else {
        dt_pp_schedule_chart(stdout, &s);
    }
    dt_pp_schedule_free(&s);
    return rc ? 1 : 0;
}
