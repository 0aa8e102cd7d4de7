/*
 * `dtrain launch`'s options: both the dtrain spellings and torchrun's, so
 * that a torchrun command line works after replacing the program name.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/launch.h"
#include "comm/bootstrap/bootstrap.h"
#include "core/parse.h"

#define MAX_GRACE_S 86400.0
#define DEFAULT_GRACE_S 5.0

enum opt_id {
    OPT_NPROC,
    OPT_NNODES,
    OPT_NODE_RANK,
    OPT_MASTER_ADDR,
    OPT_MASTER_PORT,
    OPT_GRACE,
    OPT_MAX_RESTARTS,
    OPT_MIN_NPROC,
    OPT_STANDALONE,
    OPT_TAG_OUTPUT,
    OPT_BIND_TO,
    OPT_REPORT_BINDINGS,
    OPT_HELP,
};

struct opt_spec {
    const char *name;
    enum opt_id id;
    int has_value;
};

static const struct opt_spec opt_specs[] = {
    {"-n", OPT_NPROC, 1},
    {"--nproc-per-node", OPT_NPROC, 1},
    {"--nproc_per_node", OPT_NPROC, 1},
    {"--nnodes", OPT_NNODES, 1},
    {"--node-rank", OPT_NODE_RANK, 1},
    {"--node_rank", OPT_NODE_RANK, 1},
    {"--master-addr", OPT_MASTER_ADDR, 1},
    {"--master_addr", OPT_MASTER_ADDR, 1},
    {"--master-port", OPT_MASTER_PORT, 1},
    {"--master_port", OPT_MASTER_PORT, 1},
    {"--grace-period", OPT_GRACE, 1},
    {"--grace_period", OPT_GRACE, 1},
    {"--max-restarts", OPT_MAX_RESTARTS, 1},
    {"--max_restarts", OPT_MAX_RESTARTS, 1},
    {"--min-nproc", OPT_MIN_NPROC, 1},
    {"--min_nproc", OPT_MIN_NPROC, 1},
    {"--standalone", OPT_STANDALONE, 0},
    {"--tag-output", OPT_TAG_OUTPUT, 0},
    {"--tag_output", OPT_TAG_OUTPUT, 0},
    {"--bind-to", OPT_BIND_TO, 1},
    {"--report-bindings", OPT_REPORT_BINDINGS, 0},
    {"-h", OPT_HELP, 0},
    {"--help", OPT_HELP, 0},
};

void launch_usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain launch [-n N] [--nnodes M] [--node-rank R] [--master-addr A]\n"
            "                     [--master-port P] [--standalone] [--tag-output]\n"
            "                     [--grace-period S] [--max-restarts K [--min-nproc MIN]]\n"
            "                     [--bind-to core|none] [--report-bindings]\n"
            "                     [--] CMD [ARGS...]\n"
            "\n"
            "Start N ranks of CMD on this host with the torchrun environment (RANK,\n"
            "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK,\n"
            "MASTER_ADDR, MASTER_PORT) plus DTRAIN_SECRET and DTRAIN_JOB_ID.\n"
            "\n"
            "options (torchrun's spellings --nproc_per_node, --node_rank, --master_addr,\n"
            "--master_port, --max_restarts, --min_nproc and --flag=value are accepted too):\n"
            "  -n, --nproc-per-node N  ranks on this host (default 1)\n"
            "  --nnodes M              hosts in the job (default 1)\n"
            "  --node-rank R           this host's index, 0..M-1 (default 0)\n"
            "  --master-addr A         address of node 0 (default 127.0.0.1; required\n"
            "                          when M > 1)\n"
            "  --master-port P         port of the rendezvous store on node 0 (default: a\n"
            "                          free port when M = 1, 29500 when M > 1)\n"
            "  --standalone            single host with a free port (torchrun's flag)\n"
            "  --tag-output            prefix every output line with '[RANK]: '\n"
            "  --grace-period S        seconds the other ranks get to exit on their own\n"
            "                          after the first failure, before SIGTERM (default 5,\n"
            "                          or DTRAIN_GRACE_PERIOD)\n"
            "  --max-restarts K        after a rank fails, stop the others at once and\n"
            "                          start all ranks again, up to K times (0 to 1000;\n"
            "                          default 0: fail fast); on every host, with the same\n"
            "                          K on each (node 0's launcher then serves the store)\n"
            "  --min-nproc MIN         with restarts, one host only: when a restarted rank\n"
            "                          fails before it joins the job (as if its host were\n"
            "                          gone), go on with one rank fewer, down to MIN (1 to N;\n"
            "                          default N: never). The ranks keep the N ranks' share\n"
            "                          of each batch (DTRAIN_VIRTUAL_WORLD_SIZE=N; dtrain\n"
            "                          train runs DDP and ZeRO-1/2 so, rank 0 taking on the\n"
            "                          lost ranks' work)\n"
            "  --bind-to core|none     core: each rank of this host on CPUs of its own, a\n"
            "                          block of the CPUs the launcher may use (taskset -c\n"
            "                          chooses them); none: left to the scheduler. Default:\n"
            "                          core when the ranks are no more than the CPUs, else\n"
            "                          none (mpirun's default too); or DTRAIN_BIND_TO\n"
            "  --report-bindings       say each local rank's CPUs on stderr\n"
            "  -h, --help              show this text\n"
            "\n"
            "If a rank fails, the others are stopped and the exit status is the first\n"
            "failing rank's (its exit code, or 128+signal), unless restarts are left.\n"
            "With M > 1 every host must export the same DTRAIN_SECRET.\n"
            "\n"
            "examples:\n"
            "  one host, 4 ranks:\n"
            "    dtrain launch -n 4 -- ./my_program --steps 10\n"
            "  two hosts, 8 ranks each, host 0 at 10.0.0.1 (same secret on both):\n"
            "    export DTRAIN_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\n"
            "    dtrain launch -n 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 -- ./prog\n"
            "    dtrain launch -n 8 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 -- ./prog\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nRun 'dtrain launch --help' for usage.\n");
    va_end(ap);
    return -1;
}

static int parse_long(const char *flag, const char *s, long min, long max, long *out)
{
    long v;
    if (dt_parse_long(s, min, max, &v)) {
        return usage_error("invalid value '%s' for %s: expected an integer from %ld to %ld", s,
                           flag, min, max);
    }
    *out = v;
    return 0;
}

static int parse_seconds(const char *what, const char *s, double *out)
{
    double v;
    if (dt_parse_double(s, 0, MAX_GRACE_S, &v)) {
        return usage_error("invalid value '%s' for %s: expected seconds from 0 to %g", s, what,
                           MAX_GRACE_S);
    }
    *out = v;
    return 0;
}

static int parse_bind(const char *what, const char *s, int *out)
{
    if (strcmp(s, "core") == 0) *out = LAUNCH_BIND_CORE;
    else if (strcmp(s, "none") == 0) *out = LAUNCH_BIND_NONE;
    else return usage_error("invalid value '%s' for %s: expected core or none", s, what);
    return 0;
}

static const struct opt_spec *find_opt(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof opt_specs / sizeof opt_specs[0]; i++)
        if (strlen(opt_specs[i].name) == len && strncmp(opt_specs[i].name, name, len) == 0)
            return &opt_specs[i];
    return NULL;
}

/* `flag` is the spelling the user typed, so errors quote it back. */
static int apply_opt(struct launch_opts *o, const struct opt_spec *spec, const char *flag,
                     const char *value)
{
    switch (spec->id) {
    case OPT_NPROC:
        return parse_long(flag, value, 1, DT_MAX_LOCAL_RANKS, &o->nproc);
    case OPT_NNODES:
        return parse_long(flag, value, 1, MAX_NNODES, &o->nnodes);
    case OPT_NODE_RANK:
        return parse_long(flag, value, 0, MAX_NNODES - 1, &o->node_rank);
    case OPT_MASTER_ADDR:
        if (*value == '\0') return usage_error("empty value for %s", flag);
        o->master_addr = value;
        return 0;
    case OPT_MASTER_PORT:
        return parse_long(flag, value, 1, 65535, &o->master_port);
    case OPT_GRACE:
        o->grace_given = 1;
        return parse_seconds(flag, value, &o->grace_s);
    case OPT_MAX_RESTARTS:
        return parse_long(flag, value, 0, MAX_RESTARTS, &o->max_restarts);
    case OPT_MIN_NPROC: /* its range depends on -n: launch_check_opts */
        o->min_nproc_given = 1;
        if (dt_parse_long(value, LONG_MIN, LONG_MAX, &o->min_nproc))
            return usage_error("invalid value '%s' for %s: expected a rank count from 1 to N "
                               "(-n N)", value, flag);
        return 0;
    case OPT_STANDALONE:
        o->standalone = 1;
        return 0;
    case OPT_TAG_OUTPUT:
        o->tag_output = 1;
        return 0;
    case OPT_BIND_TO:
        return parse_bind(flag, value, &o->bind);
    case OPT_REPORT_BINDINGS:
        o->report_bindings = 1;
        return 0;
    case OPT_HELP:
        o->help = 1;
        return 0;
    }
    return -1;
}

/* One argument (and maybe the next, as its value). Returns how many
 * arguments it used, or -1. Accepts `--flag value`, `--flag=value`,
 * `-n value`, `-n=value` and `-nvalue`. */
static int parse_one(struct launch_opts *o, char *arg, char *next)
{
    char flag[64];
    const char *attached = NULL;
    size_t name_len;
    if (arg[1] == '-') {
        const char *eq = strchr(arg, '=');
        name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (eq) attached = eq + 1;
    } else {
        name_len = 2;
        if (arg[2] != '\0') attached = arg[2] == '=' ? arg + 3 : arg + 2;
    }
    if (name_len >= sizeof flag) name_len = sizeof flag - 1;
    memcpy(flag, arg, name_len);
    flag[name_len] = '\0';

    const struct opt_spec *spec = find_opt(arg, name_len);
    if (!spec) return usage_error("unknown option '%s'", flag);
    if (!spec->has_value) {
        if (attached) return usage_error("option %s takes no value (got '%s')", flag, attached);
        return apply_opt(o, spec, flag, NULL) < 0 ? -1 : 1;
    }
    if (attached) return apply_opt(o, spec, flag, attached) < 0 ? -1 : 1;
    if (!next) return usage_error("option %s needs a value", flag);
    return apply_opt(o, spec, flag, next) < 0 ? -1 : 2;
}

/* Options end at `--` or at the first word that is not an option (the
 * command), so the command's own flags are never taken for ours. */
int launch_parse_args(int argc, char **argv, struct launch_opts *o)
{
    int i = 1;
    while (i < argc) {
        char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0') break;
        int used = parse_one(o, a, i + 1 < argc ? argv[i + 1] : NULL);
        if (used < 0) return -1;
        i += used;
    }
    o->cmd = i < argc ? argv + i : NULL;
    return 0;
}

static int resolve_grace(struct launch_opts *o)
{
    if (o->grace_given) return 0;
    o->grace_s = DEFAULT_GRACE_S;
    const char *env = getenv("DTRAIN_GRACE_PERIOD");
    if (env && *env) return parse_seconds("DTRAIN_GRACE_PERIOD", env, &o->grace_s);
    return 0;
}

/* --min-nproc, and the test hook that makes a slot lost for good:
 * DTRAIN_LAUNCH_TEST_LOST_RANK=K, slot K cannot be started again once the
 * job has restarted. */
static int check_min_nproc(struct launch_opts *o)
{
    o->lost_slot = -1;
    const char *hook = getenv("DTRAIN_LAUNCH_TEST_LOST_RANK");
    if (hook && *hook &&
        parse_long("DTRAIN_LAUNCH_TEST_LOST_RANK", hook, 0, o->nproc - 1, &o->lost_slot) < 0)
        return -1;
    if (!o->min_nproc_given) return 0;
    if (o->min_nproc < 1 || o->min_nproc > o->nproc)
        return usage_error("--min-nproc %ld is out of range for -n %ld (valid: 1 to %ld)",
                           o->min_nproc, o->nproc, o->nproc);
    if (o->max_restarts == 0)
        return usage_error("--min-nproc %ld needs --max-restarts K above 0: the job shrinks "
                           "when a restarted rank cannot be started",
                           o->min_nproc);
    /* Every node would have to agree on which slot goes, and the ranks
     * on how the blocks of a batch fall then. */
    if (o->nnodes > 1)
        return usage_error("--min-nproc works on one host so far, but --nnodes is %ld: a job of "
                           "several hosts restarts (--max-restarts) with all its ranks, and "
                           "does not shrink",
                           o->nnodes);
    return 0;
}

int launch_check_opts(struct launch_opts *o)
{
    if (resolve_grace(o) < 0) return -1;
    /* The environment's choice where the flag cannot be given (dtrain train
     * --nproc N starts the launcher itself). */
    const char *bind = getenv("DTRAIN_BIND_TO");
    if (o->bind == LAUNCH_BIND_AUTO && bind && *bind &&
        parse_bind("DTRAIN_BIND_TO", bind, &o->bind))
        return -1;
    if (o->standalone && o->nnodes > 1)
        return usage_error("--standalone means one host, but --nnodes is %ld", o->nnodes);
    if (o->node_rank >= o->nnodes)
        return usage_error("--node-rank %ld is out of range for --nnodes %ld (valid: 0 to %ld)",
                           o->node_rank, o->nnodes, o->nnodes - 1);
    if (o->nnodes > 1 && !o->master_addr)
        return usage_error("--nnodes %ld needs --master-addr (the address of node 0, the same "
                           "on every node)",
                           o->nnodes);
    if (check_min_nproc(o) < 0) return -1;
    if (!o->cmd) return usage_error("no command to run");
    return 0;
}

int launch_may_shrink(const struct launch_opts *o)
{
    return o->min_nproc_given && o->min_nproc < o->nproc;
}
