/* The `dtrain` entry point: picks a subcommand from a table. A new
 * subcommand is one line in `commands` plus its function in cli.h. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

static const struct cli_command commands[] = {
    {"train", cli_train, "train a GPT in this process (flags, or a DeepSpeed-style --config)"},
    {"sample", cli_sample, "generate text from a checkpoint"},
    {"launch", cli_launch, "start N ranks of a program with the torchrun environment"},
    {"bench", cli_bench, "benchmarks: `bench comm` times collectives, `bench peak` the CPU's peak FLOP/s"},
    {"ckpt", cli_ckpt, "checkpoints: `ckpt info` prints a layout, `ckpt consolidate` the whole model"},
    {"data", cli_data, "prepare training data: `data prepare` makes llm.c token shards"},
    {"plan", cli_plan, "which layout (tp, cp, dp, pp, ZeRO, schedule) fits a model on a cluster and is fastest; or draw a pipeline schedule"},
    {"simulate", cli_simulate, "a DDP step or one collective over a simulated network of up to 10^6 ranks"},
    {"trace", cli_trace, "timelines: `trace summary FILE` prints each rank's busy, communication and idle fractions"},
};

static const int ncommands = (int)(sizeof commands / sizeof commands[0]);

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain <command> [options] [args]\n"
            "       dtrain help [command]\n"
            "       dtrain --version\n"
            "\n"
            "commands:\n");
    for (int i = 0; i < ncommands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nRun 'dtrain <command> --help' for the options of a command.\n");
}

static const struct cli_command *find_command(const char *name)
{
    for (int i = 0; i < ncommands; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

/* `dtrain help launch` is `dtrain launch --help`: every subcommand owns its
 * help text, so there is one place to keep it right. */
static int run_help(int argc, char **argv)
{
    if (argc < 2) {
        usage(stdout);
        return 0;
    }
    const struct cli_command *c = find_command(argv[1]);
    if (!c) {
        fprintf(stderr, "dtrain: unknown command '%s'\n\n", argv[1]);
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    char *help_argv[] = {argv[1], "--help", NULL};
    return c->run(2, help_argv);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--version") == 0 || strcmp(name, "version") == 0) {
        printf("dtrain %s\n", DTRAIN_VERSION);
        return 0;
    }
    if (strcmp(name, "help") == 0 || strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0)
        return run_help(argc - 1, argv + 1);

    const struct cli_command *c = find_command(name);
    if (!c) {
        fprintf(stderr, "dtrain: unknown command '%s'\n\n", name);
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    return c->run(argc - 1, argv + 1);
}
