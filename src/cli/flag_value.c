/* `--flag=value` beside `--flag value` for the commands that read their
 * own flags (`dtrain plan`, `dtrain simulate`), as the trainer's table
 * (train/config/flags.c) and the launcher (cli/launch_opts.c) take them. */
#include <string.h>

#include "cli/cli.h"

const char *cli_flag_split(const char *arg, char *name, size_t n)
{
    const char *eq = strncmp(arg, "--", 2) ? NULL : strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    if (len >= n) len = n - 1; /* too long for any flag: still unknown, and named */
    memcpy(name, arg, len);
    name[len] = '\0';
    return eq ? eq + 1 : NULL;
}

const char *cli_flag_value(int argc, char **argv, int *i, const char *attached)
{
    if (attached) return attached;
    return *i + 1 < argc ? argv[++*i] : NULL;
}
