/* The command line of `dtrain train`: "--name value" or "--name=value",
 * every --config file first, then the other flags in order. */
#include <stdio.h>
#include <string.h>

#include "core/str.h"
#include "train/config/internal.h"

/* Edit distance of short strings, for "did you mean". */
static int edit_distance(const char *a, size_t la, const char *b)
{
    size_t lb = strlen(b);
    int row[64];
    if (la >= 64 || lb >= 64) return 99;
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up, row[j] = best;
        }
    }
    return row[lb];
}

static int unknown_flag(const char *name, size_t len, char *err, size_t n)
{
    int best = -1, bestd = 3;
    for (int i = 0; i < dt_cfg_noptions; i++) {
        int d = edit_distance(name, len, dt_cfg_options[i].flag);
        if (d < bestd) best = i, bestd = d;
    }
    if (best >= 0)
        dt_strf(err, n, "unknown option '--%.*s' (did you mean --%s? see --help)", (int)len, name,
                dt_cfg_options[best].flag);
    else
        dt_strf(err, n, "unknown option '--%.*s' (see --help)", (int)len, name);
    return -1;
}

/* Splits argv[*i] into its option and value, consuming the next argument
 * when the value is separate. A value that looks like a flag ("--out
 * --resume") is taken as a missing value rather than as a path. */
static int next_flag(int argc, char **argv, int *i, int *idx, const char **val, char *err,
                     size_t n)
{
    const char *a = argv[*i];
    if (strncmp(a, "--", 2) || !a[2])
        return dt_strf(err, n, "unexpected argument '%s' (options start with --; see --help)",
                       a), -1;
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    if ((*idx = dt_cfg_find_flag(name, len)) < 0) return unknown_flag(name, len, err, n);
    const dt_cfg_opt *o = &dt_cfg_options[*idx];
    const char *next = *i + 1 < argc ? argv[*i + 1] : NULL;
    *val = eq ? eq + 1 : NULL;
    if (eq && (o->flags & O_NOVAL)) return dt_strf(err, n, "--%s takes no value", o->flag), -1;
    if (eq || (o->flags & O_NOVAL)) return 0;
    if (o->flags & O_OPTVAL) {
        if (next && next[0] != '-') *val = next, ++*i;
        return 0;
    }
    if (!next || !strncmp(next, "--", 2))
        return dt_strf(err, n, "--%s needs a value (--%s %s)", o->flag, o->flag, o->meta), -1;
    *val = next, ++*i;
    return 0;
}

/* Phase 0 loads the --config files, phase 1 applies the other flags. */
static int walk_flags(dt_train_config *c, int argc, char **argv, int phase, char *err, size_t n)
{
    for (int i = 1; i < argc; i++) {
        int idx;
        const char *val;
        if (next_flag(argc, argv, &i, &idx, &val, err, n)) return -1;
        const dt_cfg_opt *o = &dt_cfg_options[idx];
        int is_config = !strcmp(o->flag, "config");
        if (phase == 0 && is_config && dt_config_load_json(c, val, err, n)) return -1;
        if (phase == 1 && o->type != T_ACTION) {
            char who[64];
            dt_strf(who, sizeof who, "--%s", o->flag);
            if (dt_cfg_set_text(c, idx, who, val ? val : "", err, n)) return -1;
        }
    }
    return 0;
}

int dt_config_parse_args(dt_train_config *c, int argc, char **argv, char *err, size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            dt_config_usage(stdout);
            return 1;
        }
    }
    if (walk_flags(c, argc, argv, 0, err, errlen)) return -1;
    return walk_flags(c, argc, argv, 1, err, errlen);
}
