/* `dtrain train`: one process trains a GPT (see train/trainer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "train/config.h"
#include "train/trainer.h"
#include "core/parse.h"

/* `--nproc N`: the command starts N ranks of itself through `dtrain launch`
 * (torchrun's standalone mode). Under a launcher already, it only has to
 * agree with the job's size. Returns -1 when absent. */
static long take_nproc(int *argc, char **argv)
{
    long n = -1;
    for (int i = 1; i < *argc; i++) {
        const char *v = NULL;
        int used = 1;
        if (strcmp(argv[i], "--nproc") == 0 && i + 1 < *argc) {
            v = argv[i + 1];
            used = 2;
        } else if (strncmp(argv[i], "--nproc=", 8) == 0) {
            v = argv[i] + 8;
        } else {
            continue;
        }
        if (dt_parse_long(v, 1, 4096, &n)) return 0;
        memmove(&argv[i], &argv[i + used], (size_t)(*argc - i - used + 1) * sizeof *argv);
        *argc -= used;
        i--;
    }
    return n;
}

static int relaunch(long nproc, int argc, char **argv)
{
    char exe[4096], n[24];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        fprintf(stderr, "dtrain train: --nproc: cannot find this program's path\n");
        return 1;
    }
    exe[len] = 0;
    snprintf(n, sizeof n, "%ld", nproc);
    char **args = calloc((size_t)argc + 8, sizeof *args);
    if (!args) return 1;
    int k = 0;
    args[k++] = "launch";
    args[k++] = "-n";
    args[k++] = n;
    args[k++] = "--";
    args[k++] = exe;
    args[k++] = "train";
    for (int i = 1; i < argc; i++) args[k++] = argv[i];
    int rc = cli_launch(k, args);
    free(args);
    return rc;
}

int cli_train(int argc, char **argv)
{
    long nproc = take_nproc(&argc, argv);
    if (nproc == 0) {
        fprintf(stderr, "dtrain train: --nproc needs a rank count from 1 to 4096\n");
        return CLI_EXIT_USAGE;
    }
    const char *world = getenv("WORLD_SIZE");
    if (nproc > 1 && !world) return relaunch(nproc, argc, argv);
    if (nproc > 0 && world && atol(world) != nproc) {
        fprintf(stderr, "dtrain train: --nproc %ld, but the launcher started %s ranks\n", nproc,
                world);
        return CLI_EXIT_USAGE;
    }
    dt_train_config c;
    char err[1024];
    dt_config_defaults(&c);
    int rc = dt_config_parse_args(&c, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc != 0) {
        fprintf(stderr, "dtrain train: %s\n", err);
        return CLI_EXIT_USAGE;
    }
    rc = dt_train(&c, err, sizeof err);
    if (rc > 128) {
        fprintf(stderr, "dtrain train: interrupted\n");
        return rc;
    }
    if (rc != 0) {
        fprintf(stderr, "dtrain train: error: %s\n", err);
        return 1;
    }
    return 0;
}
