/* `dtrain train`: one process trains a GPT (see train/trainer.h). */
#include <stdio.h>

#include "cli/cli.h"
#include "train/config.h"
#include "train/trainer.h"

int cli_train(int argc, char **argv)
{
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
