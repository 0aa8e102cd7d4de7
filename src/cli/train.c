/* `dtrain train`: one process trains a GPT (see train/trainer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/launch.h" /* MAX_RESTARTS, the bound of the launch it starts */
#include "comm/bootstrap/bootstrap.h"
#include "core/parse.h"
#include "core/str.h"
#include "dtrain/comm.h"
#include "train/config/config.h"
#include "train/dry_run.h"
#include "train/trainer.h"

/* Takes every `--flag V` and `--flag=V` out of argv; the value of the last
 * one, or NULL when there is none. */
static const char *take_flag(int *argc, char **argv, const char *flag)
{
    const char *v = NULL;
    size_t len = strlen(flag);
    for (int i = 1; i < *argc; i++) {
        int used = 1;
        if (strcmp(argv[i], flag) == 0 && i + 1 < *argc) {
            v = argv[i + 1];
            used = 2;
        } else if (strncmp(argv[i], flag, len) == 0 && argv[i][len] == '=') {
            v = argv[i] + len + 1;
        } else {
            continue;
        }
        memmove(&argv[i], &argv[i + used], (size_t)(*argc - i - used + 1) * sizeof *argv);
        *argc -= used;
        i--;
    }
    return v;
}

/* `--nproc N`: the command starts N ranks of itself through `dtrain launch`
 * (torchrun's standalone mode). Under a launcher already, it only has to
 * agree with the job's size, and a dry run plans for N ranks: both may
 * count the ranks of many hosts. Returns -1 when absent, 0 when invalid. */
static long take_nproc(int *argc, char **argv)
{
    long n;
    const char *v = take_flag(argc, argv, "--nproc");
    if (!v) return -1;
    if (dt_parse_long(v, 1, DT_MAX_WORLD_SIZE, &n)) {
        fprintf(stderr, "dtrain train: --nproc needs a rank count from 1 to %d (%d at "
                "most on one host), not '%s'\n", DT_MAX_WORLD_SIZE, DT_MAX_LOCAL_RANKS, v);
        return 0;
    }
    return n;
}

/* `--max-restarts K`, for the launch that --nproc starts: the text to pass
 * on; NULL when absent, or after a message when invalid (*bad). */
static const char *take_max_restarts(int *argc, char **argv, int *bad)
{
    long k;
    const char *v = take_flag(argc, argv, "--max-restarts");
    *bad = v && dt_parse_long(v, 0, MAX_RESTARTS, &k);
    if (*bad)
        fprintf(stderr, "dtrain train: --max-restarts needs a count from 0 to %d, not '%s'\n",
                MAX_RESTARTS, v);
    return *bad ? NULL : v;
}

/* --min-nproc M, passed on to the launch as text (the launcher checks its
 * range against N): up front, the layout checked for a job that may
 * shrink, so that a layout that cannot is refused before any rank starts.
 * 0, or a usage error after a message. */
static int check_min_nproc(long nproc, const char *min_nproc, int argc, char **argv)
{
    long m;
    if (!min_nproc || dt_parse_long(min_nproc, 1, nproc - 1, &m)) return 0;
    dt_train_config c;
    char err[1024];
    dt_config_defaults(&c);
    if (dt_config_parse_args(&c, argc, argv, err, sizeof err) != 0) return 0; /* the ranks say */
    if (dt_config_check_shrink(&c, err, sizeof err) == 0) return 0;
    fprintf(stderr, "dtrain train: %s\n", err);
    return CLI_EXIT_USAGE;
}

static int relaunch(long nproc, const char *max_restarts, const char *min_nproc, int argc,
                    char **argv)
{
    char exe[4096], n[24];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        fprintf(stderr, "dtrain train: --nproc: cannot find this program's path\n");
        return 1;
    }
    exe[len] = 0;
    snprintf(n, sizeof n, "%ld", nproc);
    char **args = calloc((size_t)argc + 12, sizeof *args);
    if (!args) return 1;
    int k = 0;
    args[k++] = "launch";
    args[k++] = "-n";
    args[k++] = n;
    if (max_restarts) {
        args[k++] = "--max-restarts";
        args[k++] = (char *)max_restarts;
    }
    if (min_nproc) {
        args[k++] = "--min-nproc";
        args[k++] = (char *)min_nproc;
    }
    args[k++] = "--";
    args[k++] = exe;
    args[k++] = "train";
    for (int i = 1; i < argc; i++) args[k++] = argv[i];
    int rc = cli_launch(k, args);
    free(args);
    return rc;
}

/* ---- --dry-run ------------------------------------------------------------ */

/* The flag is an action of the option table (so --help lists it and the
 * parser accepts it); no flag takes a value that starts with "--", so an
 * argument spelled so is the flag. */
static int wants_dry_run(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--dry-run") == 0) return 1;
    return 0;
}

/* The whole configuration parsed and validated as a run over `world`
 * processes would (--nproc, else the launcher's), then the plan. */
static int dry_run(long nproc, int argc, char **argv)
{
    dt_bootstrap b;
    char err[1024];
    if (dt_bootstrap_from_env(&b, err, sizeof err)) {
        fprintf(stderr, "dtrain train: %s\n", err);
        return CLI_EXIT_USAGE;
    }
    if (nproc > 0 && b.size > 1 && b.size != nproc) {
        fprintf(stderr, "dtrain train: --nproc %ld, but the launcher started %d ranks\n", nproc,
                b.size);
        return CLI_EXIT_USAGE;
    }
    int world = nproc > 0 ? (int)nproc : b.size;
    dt_train_config c;
    dt_config_defaults(&c);
    int rc = dt_config_parse_args(&c, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc == 0) rc = dt_dry_run_check(&c, world, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "dtrain train: %s\n", err);
        return CLI_EXIT_USAGE;
    }
    if (dt_dry_run(&c, world, b.rank != 0 ? NULL : stdout, err, sizeof err)) {
        fprintf(stderr, "dtrain train: --dry-run: %s\n", err);
        return 1;
    }
    return 0;
}

/* A rank that refuses its command line never reaches the check that the
 * ranks' options agree (train/config/agree.h), and the others would wait
 * for it to join until DTRAIN_TIMEOUT. When this process is one rank of
 * several, it joins the job only to stop it (as MPI_Abort would), so that
 * every rank fails at once naming it and its reason. It waits for the
 * others to join 10 s at most: they may never come, and its own error is
 * already printed. */
#define STOP_JOIN_S 10

static void stop_the_job(const char *why)
{
    dt_bootstrap b;
    char e[256];
    if (dt_bootstrap_from_env(&b, e, sizeof e) != 0 || b.size <= 1) return;
    if (b.timeout_s > STOP_JOIN_S) {
        char s[16];
        snprintf(s, sizeof s, "%d", STOP_JOIN_S);
        setenv("DTRAIN_TIMEOUT", s, 1);
    }
    dt_comm *world;
    char reason[1100];
    dt_strf(reason, sizeof reason, "it refused its command line: %s", why);
    if (dt_comm_init(&world) != 0) return;
    dt_comm_abort(world, reason);
    dt_comm_destroy(world);
}

static int refuse(const char *msg)
{
    fprintf(stderr, "dtrain train: %s\n", msg);
    fflush(stderr);
    stop_the_job(msg);
    return CLI_EXIT_USAGE;
}

/* Without --nproc, a mesh whose every size is given (the --dp flag, with
 * --tp, --cp, --pp) starts their product of ranks; -1 otherwise (one
 * process, or the launcher's ranks). Only with the flag: parsing reads the
 * --config files, and one may be a stream (a pipe) that can be read once. */
static long mesh_ranks(int argc, char **argv)
{
    dt_train_config c;
    char err[1024];
    int given = 0;
    for (int i = 1; i < argc; i++)
        given |= !strcmp(argv[i], "--dp") || !strncmp(argv[i], "--dp=", 5);
    if (!given) return -1;
    dt_config_defaults(&c);
    if (dt_config_parse_args(&c, argc, argv, err, sizeof err) != 0 || c.dp < 1) return -1;
    return (long)c.dp * c.tp * c.cp * c.pp;
}

int cli_train(int argc, char **argv)
{
    long nproc = take_nproc(&argc, argv);
    if (nproc == 0) return CLI_EXIT_USAGE;
    int bad;
    const char *max_restarts = take_max_restarts(&argc, argv, &bad);
    if (bad) return CLI_EXIT_USAGE;
    const char *min_nproc = take_flag(&argc, argv, "--min-nproc");
    const char *world = getenv("WORLD_SIZE");
    char err[1024];
    /* Restarts are the launcher's: a rank cannot start its job again. */
    if (max_restarts && (nproc < 1 || world)) {
        dt_strf(err, sizeof err, "--max-restarts works with --nproc N, which starts the ranks "
                "through `dtrain launch`; under a launcher, give it to the launcher (`dtrain "
                "launch --max-restarts %s`, or torchrun's --max-restarts)", max_restarts);
        return refuse(err);
    }
    if (min_nproc && (nproc < 1 || world)) {
        dt_strf(err, sizeof err, "--min-nproc works with --nproc N and --max-restarts K, which "
                "start the ranks through `dtrain launch`; under a launcher, give it to the "
                "launcher (`dtrain launch --max-restarts K --min-nproc %s`)", min_nproc);
        return refuse(err);
    }
    if (wants_dry_run(argc, argv)) return dry_run(nproc, argc, argv);
    if (nproc < 0 && !world) nproc = mesh_ranks(argc, argv);
    if (nproc > DT_MAX_LOCAL_RANKS && !world) {
        fprintf(stderr, "dtrain train: %ld ranks to start on this host (--nproc, or --dp x "
                "--tp x --cp x --pp), but `dtrain launch -n` starts at most %d; for more, run "
                "`dtrain launch --nnodes` on each host (or plan them with --dry-run)\n",
                nproc, DT_MAX_LOCAL_RANKS);
        return CLI_EXIT_USAGE;
    }
    /* With restarts, even one rank runs under the launcher, which restarts it. */
    if ((nproc > 1 || max_restarts || min_nproc) && !world) {
        if (check_min_nproc(nproc, min_nproc, argc, argv)) return CLI_EXIT_USAGE;
        return relaunch(nproc, max_restarts, min_nproc, argc, argv);
    }
    /* A job that shrank is still the job of the ranks it started with. */
    const char *started = getenv("DTRAIN_VIRTUAL_WORLD_SIZE");
    if (nproc > 0 && world && atol(started && *started ? started : world) != nproc) {
        dt_strf(err, sizeof err, "--nproc %ld, but the launcher started %s ranks", nproc,
                started && *started ? started : world);
        return refuse(err);
    }
    dt_train_config c;
    dt_config_defaults(&c);
    int rc = dt_config_parse_args(&c, argc, argv, err, sizeof err);
    if (rc == 1) return 0;
    if (rc != 0) return refuse(err);
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
