/* What the tests of the training configuration share: a command line
 * parsed onto a config, and a scratch JSON file for --config. */
#ifndef DT_TESTS_TRAIN_CONFIG_UTIL_H
#define DT_TESTS_TRAIN_CONFIG_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/config/config.h"

static char err[8192];
static char json_path[256];

/* Parses a space-separated command line (argv[0] = "train") onto c as it
 * is: 0, 1 (--help) or -1 with the message in err. */
static inline int parse_line(dt_train_config *c, const char *line)
{
    char buf[4096], *argv[128];
    int argc = 0;
    argv[argc++] = "train";
    snprintf(buf, sizeof buf, "%s", line);
    for (char *t = strtok(buf, " "); t && argc < 127; t = strtok(NULL, " ")) argv[argc++] = t;
    argv[argc] = NULL;
    err[0] = 0;
    return dt_config_parse_args(c, argc, argv, err, sizeof err);
}

/* Defaults, then the command line, then validation at dp ranks. */
static inline int run_line(dt_train_config *c, const char *line, int dp)
{
    dt_config_defaults(c);
    int rc = parse_line(c, line);
    if (rc) return rc;
    return dt_config_validate(c, dp, err, sizeof err);
}

/* json_path: $TMPDIR/dtrain_<name>_<pid>.json (remove it at the end). */
static inline void json_path_init(const char *name)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(json_path, sizeof json_path, "%s/dtrain_%s_%d.json", tmp ? tmp : "/tmp", name,
             (int)getpid());
}

static inline const char *write_json(const char *text)
{
    FILE *f = fopen(json_path, "w");
    if (!f) {
        perror(json_path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
    return json_path;
}

#endif
