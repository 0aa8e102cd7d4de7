/* The `dtrain` command's subcommands. Each takes the arguments from the
 * subcommand's name on (argv[0] is "launch", "bench", ...), handles its own
 * --help, and returns the process exit status: 0 on success, 2 for a usage
 * error, anything else for a failure of the work itself. */
#ifndef DT_CLI_CLI_H
#define DT_CLI_CLI_H

#ifndef DTRAIN_VERSION
#define DTRAIN_VERSION "0.1.0-dev"
#endif

#include <stddef.h>
#include <stdio.h>

#include "train/config/config.h"

/* Exit status for a command line that cannot be run as written. */
#define CLI_EXIT_USAGE 2

int cli_launch(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_bench_peak(int argc, char **argv);
int cli_data(int argc, char **argv);
int cli_ckpt(int argc, char **argv);
int cli_train(int argc, char **argv);
int cli_sample(int argc, char **argv);
int cli_plan(int argc, char **argv);
int cli_plan_layouts(int argc, char **argv);
int cli_trace(int argc, char **argv);
int cli_simulate(int argc, char **argv);

/* A flag of argv, `--flag value` or `--flag=value` (cli/flag_value.c).
 * cli_flag_split: the flag's name (up to an '=' when the argument starts
 * with "--") into name, n bytes; returns the text after the '=', or NULL
 * when there is none. cli_flag_value: the value of the flag at argv[*i],
 * the attached text when there is some, else the next argument (then *i
 * moves past it); NULL when there is neither. */
const char *cli_flag_split(const char *arg, char *name, size_t n);
const char *cli_flag_value(int argc, char **argv, int *i, const char *attached);
/* The help of `dtrain plan`: both forms (cli/plan.c), the layout
 * planner's flags among them (cli/plan_layouts.c). */
void cli_plan_usage(FILE *f);
void cli_plan_layouts_flags(FILE *f);

/* The sizes of a model given by the trainer's flags in argv[1..*argc)
 * (argv[0] the command; "--model gpt2" appended, room permitting, when no
 * --model is there): the parsed configuration, the model, the sequence
 * length. 0, or -1 with err (cli/model_flags.c). */
int cli_model_options(char **argv, int *argc, int cap, dt_train_config *c, dt_gpt_config *cfg,
                      int *T, char *err, size_t n);

#endif
