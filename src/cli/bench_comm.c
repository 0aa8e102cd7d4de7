/*
 * `dtrain bench comm`: the nccl-tests of dtrain. For each message size it
 * times a collective out of place and in place and prints the nccl-tests
 * table (time, algorithm bandwidth, bus bandwidth, #wrong) plus memory
 * efficiency; for every algorithm of the op if asked, against MPI's
 * collective with --peer mpi, as CSV with --format csv, or beside the cost
 * model's predictions with --explain. Inputs are small integers so the
 * expected result is exact and every wrong element is counted. Run it
 * under `dtrain launch`, mpirun or srun, or give --nproc N to have it
 * start its own ranks. See docs/bench_comm.md.
 *
 * This file: options, relaunching, --calibrate, the driver. The
 * measurement is in bench_comm_measure.c, the output in bench_comm_report.c.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/bench_comm.h"
#include "cli/cli.h"
#include "core/parse.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain bench comm [--nproc N] [--op OP] [--algo A] [--min-bytes B]\n"
            "                         [--max-bytes B] [--step-factor F] [--dtype T] [--iters N]\n"
            "                         [--warmup N] [--format table|csv] [--peer mpi] [--explain]\n"
            "                         [--buffers comm|malloc]\n"
            "                         [--calibrate [FILE]]\n"
            "\n"
            "  --op OP          allreduce (default), allgather, reduce_scatter, broadcast,\n"
            "                   alltoall, alltoallv, or all (one table per op)\n"
            "  --algo A         auto (the cost model's choice per size), an algorithm, a comma\n"
            "                   list, or all (every algorithm of the op); default: auto, or\n"
            "                   DTRAIN_<OP>_ALGO when set\n"
            "  --min-bytes B    smallest message (default 8; K, M, G suffixes)\n"
            "  --max-bytes B    largest message (default 64M)\n"
            "  --step-factor F  size multiplier between rows (default 4)\n"
            "  --dtype T        f32 (default), f64, bf16, f16, i32, i64, u8\n"
            "  --iters N        timed iterations per size (default: 1000 up to 64K, 100 up to\n"
            "                   4M, 20 above)\n"
            "  --warmup N       untimed iterations first (default a tenth of --iters, at least 5)\n"
            "  --format F       table (default: nccl-tests layout) or csv (a row per\n"
            "                   measurement)\n"
            "  --peer mpi       also time MPI's collective at every size, in the same\n"
            "                   processes (needs mpirun and dtrain built with MPI)\n"
            "  --buffers B      where both libraries' send and receive buffers come from:\n"
            "                   comm (default: dt_comm_mem_alloc, which local peers read\n"
            "                   through a mapping) or malloc (pulled by cross-memory attach)\n"
            "  --explain        the cost model's prediction beside the measured time of every\n"
            "                   algorithm, marking auto's pick and the fastest\n"
            "  --calibrate [FILE]  measure the cost model (alpha, beta, gamma) first, print it\n"
            "                   and save it to FILE for DTRAIN_COMM_MODEL=FILE; alone (no\n"
            "                   --op, --algo, --explain, --peer, --format) it only calibrates\n"
            "  --nproc N        start N local ranks (with --peer mpi: under mpirun), otherwise\n"
            "                   run under dtrain launch, mpirun or srun\n"
            "\n"
            "examples:\n"
            "  dtrain bench comm --nproc 2 --op allreduce --max-bytes 256M\n"
            "  dtrain bench comm --nproc 4 --op all --algo all --format csv > bench.csv\n"
            "  dtrain bench comm --nproc 4 --calibrate model.json\n"
            "  DTRAIN_COMM_MODEL=model.json dtrain bench comm --nproc 4 --explain --max-bytes 1M\n");
}

static int bad(const char *flag, const char *val, const char *why)
{
    fprintf(stderr, BENCH ": invalid value '%s' for %s%s%s\n", val ? val : "", flag,
            why ? ": " : "", why ? why : "");
    return CLI_EXIT_USAGE;
}

/* A byte count: digits with an optional K, M or G (powers of 1024),
 * optionally followed by B or iB. */
static int parse_bytes(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mult = 1;
    if (end == s || errno || !isfinite(v) || v < 0 || !(*s >= '0' && *s <= '9')) return -1;
    if (*end == 'K' || *end == 'k') mult = 1024, end++;
    else if (*end == 'M' || *end == 'm') mult = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mult = 1024.0 * 1024 * 1024, end++;
    if (mult > 1 && *end == 'i' && end[1] == 'B') end += 2;
    else if (*end == 'B') end++;
    if (*end || v * mult > (double)(1ull << 46)) return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_int(const char *s, int min, int *out)
{
    long v;
    if (dt_parse_long(s, min, INT_MAX, &v)) return -1;
    *out = (int)v;
    return 0;
}

static int parse_dtype(const char *s, dt_dtype *out)
{
    for (int t = 0; t < DT_DTYPE_COUNT; t++)
        if (!strcmp(s, dt_dtype_name((dt_dtype)t))) {
            *out = (dt_dtype)t;
            return 0;
        }
    return -1;
}

/* Every name in --algo must be auto, all, or an algorithm of a chosen op. */
static int check_algos(const bench_opts *o)
{
    char buf[512], choices[1024];
    size_t c = (size_t)snprintf(choices, sizeof choices, "choices: auto, all");
    for (int op = 0; op < B_NOPS; op++) {
        if (!o->op_on[op]) continue;
        const char *names[BENCH_MAX_ALGOS];
        int n = dt_comm_algo_names(bench_op_names[op], names, BENCH_MAX_ALGOS);
        for (int i = 0; i < n && c < sizeof choices; i++)
            c += (size_t)snprintf(choices + c, sizeof choices - c, "%s%s%s%s", i ? "" : "; ",
                                  i ? "" : bench_op_names[op], i ? ", " : ": ", names[i]);
    }
    if (strlen(o->algo) >= sizeof buf) return bad("--algo", o->algo, "too long");
    snprintf(buf, sizeof buf, "%s", o->algo);
    const char *p = buf;
    for (char *t = buf;; t++) {
        if (*t != ',' && *t) continue;
        int end = !*t;
        *t = '\0';
        int ok = *p && (!strcmp(p, "auto") || !strcmp(p, "all"));
        for (int op = 0; op < B_NOPS && !ok && *p; op++)
            ok = o->op_on[op] && dt_comm_algo_summary(bench_op_names[op], p) != NULL;
        if (!ok) {
            int nops = 0;
            for (int op = 0; op < B_NOPS; op++) nops += o->op_on[op];
            char name[520], why[2400];
            if (*p) snprintf(name, sizeof name, "'%s'", p);
            else snprintf(name, sizeof name, "an empty name");
            snprintf(why, sizeof why, "%s is not an algorithm of the chosen op%s (%s)", name,
                     nops > 1 ? "s" : "", choices);
            return bad("--algo", o->algo, why);
        }
        if (end) break;
        p = t + 1;
    }
    return 0;
}

static int parse_opts(int argc, char **argv, bench_opts *o)
{
    *o = (bench_opts){.min_bytes = 8, .max_bytes = 64u << 20, .factor = 4, .dtype = DT_F32,
                      .warmup = -1};
    o->op_on[B_ALLREDUCE] = 1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        char flag[64];
        const char *v = NULL, *eq = strchr(f, '=');
        int inline_val = eq && !strncmp(f, "--", 2) && (size_t)(eq - f) < sizeof flag;
        if (inline_val) {
            snprintf(flag, sizeof flag, "%.*s", (int)(eq - f), f);
            f = flag;
            v = eq + 1;
        }
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout);
            exit(0);
        }
        /* Flags without a value, or with an optional one. */
        if (!strcmp(f, "--explain") && !inline_val) {
            o->explain = 1;
            continue;
        }
        if (!strcmp(f, "--calibrate")) {
            o->calibrate = 1;
            if (!inline_val && i + 1 < argc && argv[i + 1][0] != '-') v = argv[++i];
            if (v && !*v) return bad(f, v, "an empty file name");
            o->calibrate_path = v;
            continue;
        }
        static const char *const valued[] = {"--op", "--algo", "--min-bytes", "--max-bytes",
                                             "--step-factor", "--dtype", "--iters", "--warmup",
                                             "--nproc", "--peer", "--format", "--buffers"};
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(f, valued[k]);
        if (!known) {
            fprintf(stderr, BENCH ": unknown option '%s'\n", argv[i]);
            usage(stderr);
            return CLI_EXIT_USAGE;
        }
        if (!inline_val) {
            if (i + 1 >= argc) {
                fprintf(stderr, BENCH ": %s needs a value\n", f);
                return CLI_EXIT_USAGE;
            }
            v = argv[++i];
        }
        if (!strcmp(f, "--op")) {
            int k = 0;
            while (k < B_NOPS && strcmp(v, bench_op_names[k])) k++;
            if (k == B_NOPS && strcmp(v, "all"))
                return bad(f, v, "choices: allreduce, allgather, reduce_scatter, broadcast, "
                                 "alltoall, alltoallv, all");
            for (int j = 0; j < B_NOPS; j++) o->op_on[j] = k == B_NOPS || j == k;
            o->op_given = 1;
        } else if (!strcmp(f, "--algo")) {
            o->algo = v;
            o->algo_given = 1;
        } else if (!strcmp(f, "--min-bytes") || !strcmp(f, "--max-bytes")) {
            if (parse_bytes(v, !strcmp(f, "--min-bytes") ? &o->min_bytes : &o->max_bytes))
                return bad(f, v, "a byte count such as 4096, 64K, 16M or 1G");
        } else if (!strcmp(f, "--step-factor")) {
            if (dt_parse_double(v, 1, 1e6, &o->factor) || o->factor == 1)
                return bad(f, v, "a number above 1");
        } else if (!strcmp(f, "--dtype")) {
            if (parse_dtype(v, &o->dtype)) return bad(f, v, "choices: f32, f64, bf16, f16, i32, i64, u8");
        } else if (!strcmp(f, "--iters")) {
            if (parse_int(v, 1, &o->iters)) return bad(f, v, "a positive integer");
        } else if (!strcmp(f, "--warmup")) {
            if (parse_int(v, 0, &o->warmup)) return bad(f, v, "a non-negative integer");
        } else if (!strcmp(f, "--nproc")) {
            if (parse_int(v, 1, &o->nproc) || o->nproc > 1024) return bad(f, v, "1 to 1024");
        } else if (!strcmp(f, "--peer")) {
            if (strcmp(v, "mpi")) return bad(f, v, "the only peer is mpi");
            o->peer_mpi = 1;
        } else if (!strcmp(f, "--buffers")) {
            if (strcmp(v, "comm") && strcmp(v, "malloc")) return bad(f, v, "choices: comm, malloc");
            o->plain_buffers = !strcmp(v, "malloc");
        } else if (!strcmp(f, "--format")) {
            if (strcmp(v, "csv") && strcmp(v, "table")) return bad(f, v, "choices: table, csv");
            o->csv = !strcmp(v, "csv");
            o->format_given = 1;
        }
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, BENCH ": --min-bytes %zu is larger than --max-bytes %zu\n", o->min_bytes,
                o->max_bytes);
        return CLI_EXIT_USAGE;
    }
    if (o->explain && o->csv) {
        fprintf(stderr, BENCH ": --explain writes a text report; it does not combine with "
                        "--format csv (whose rows carry predicted_us and auto_pick already)\n");
        return CLI_EXIT_USAGE;
    }
    if (o->algo) return check_algos(o);
    return 0;
}

/* A buffer of bytes, zeroed, from where --buffers says. */
static void *bench_alloc(const bench_opts *o, size_t bytes)
{
    if (o->plain_buffers) return calloc(1, bytes);
    return dt_comm_mem_alloc(bytes);
}

static void bench_free(const bench_opts *o, void *p)
{
    if (o->plain_buffers)
        free(p);
    else
        dt_comm_mem_free(p);
}

/* The size of the job we already run in, by a launcher's variables, or 0.
 * Slurm counts only inside an srun step (a batch script has SLURM_NTASKS
 * too, and --nproc there means ranks of our own). */
static int launched_size(void)
{
    const char *vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    const char *step = getenv("SLURM_STEP_ID"), *n = getenv("SLURM_NTASKS");
    if (step && *step >= '0' && *step <= '9' && n && *n) return atoi(n);
    return 0;
}

/* Re-run ourselves as N ranks, minus the --nproc flag: under `dtrain
 * launch -n N`, or under `mpirun -np N --oversubscribe` for --peer mpi. */
static int relaunch(int argc, char **argv, const bench_opts *o)
{
    char exe[PATH_MAX], n[16];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        perror(BENCH ": finding our own executable");
        return 1;
    }
    exe[len] = '\0';
    snprintf(n, sizeof n, "%d", o->nproc);
    char **args = calloc((size_t)argc + 8, sizeof *args);
    if (!args) return 1;
    int k = 0;
    if (o->peer_mpi) {
        args[k++] = "mpirun", args[k++] = "-np", args[k++] = n, args[k++] = "--oversubscribe";
        if (geteuid() == 0) {
            setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
            setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        }
    } else {
        args[k++] = "dtrain", args[k++] = "launch", args[k++] = "-n", args[k++] = n,
        args[k++] = "--";
    }
    args[k++] = exe;
    args[k++] = "bench";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc")) {
            i++;
            continue;
        }
        if (!strncmp(argv[i], "--nproc=", 8)) continue;
        args[k++] = argv[i];
    }
    fflush(NULL);
    if (o->peer_mpi) {
        execvp("mpirun", args);
        fprintf(stderr, BENCH ": --peer mpi --nproc %d: cannot run mpirun: %s\n", o->nproc,
                strerror(errno));
        free(args);
        return CLI_EXIT_USAGE;
    }
    execv(exe, args);
    perror(BENCH ": re-running under dtrain launch");
    free(args);
    return 1;
}

static int calibrate(bench_ctx *b)
{
    const bench_opts *o = b->o;
    int rc = dt_comm_calibrate(b->c, o->calibrate_path);
    if (rc) {
        fprintf(stderr, BENCH ": --calibrate: rank %d: %s\n", b->rank, dt_comm_error(b->c));
        return 1;
    }
    if (b->rank == 0) {
        FILE *f = o->csv ? stderr : stdout;
        bench_print_model(b, f);
        if (o->calibrate_path)
            fprintf(f, "# saved to %s: later jobs use it with DTRAIN_COMM_MODEL=%s\n",
                    o->calibrate_path, o->calibrate_path);
        fflush(f);
    }
    return 0;
}

int cli_bench_comm(int argc, char **argv)
{
    bench_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    if (o.nproc) {
        int have = launched_size();
        if (!have) return relaunch(argc, argv, &o);
        if (have != o.nproc) {
            const char *r = getenv("RANK") ? getenv("RANK") : getenv("OMPI_COMM_WORLD_RANK");
            if (!r || !strcmp(r, "0")) /* said once, by rank 0 */
                fprintf(stderr, BENCH ": --nproc %d: this job already has %d ranks from its "
                            "launcher; drop --nproc\n", o.nproc, have);
            return CLI_EXIT_USAGE;
        }
    }
    int only_calibrate = o.calibrate && !o.op_given && !o.algo_given && !o.explain &&
                         !o.peer_mpi && !o.format_given;
    dt_comm *c;
    if (dt_comm_init(&c) != 0) {
        fprintf(stderr, BENCH ": %s\n", dt_last_error());
        return 1;
    }
    bench_ctx b = {.c = c, .o = &o, .rank = dt_comm_rank(c), .size = dt_comm_size(c),
                   .esz = dt_dtype_size(o.dtype), .note = o.csv ? stderr : stdout};
    if (o.calibrate) rc = calibrate(&b);
    if (rc == 0 && !only_calibrate) {
        b.alloc = o.max_bytes + 64 * b.esz * (size_t)b.size;
        b.send = bench_alloc(&o, b.alloc);
        b.recv = bench_alloc(&o, b.alloc);
        b.v = calloc(4 * (size_t)b.size, sizeof *b.v);
        if (!b.send || !b.recv || !b.v) {
            fprintf(stderr, BENCH ": rank %d: cannot allocate %zu bytes\n", b.rank, 2 * b.alloc);
            dt_comm_abort(c, "dtrain bench comm: out of memory for the buffers");
            rc = 1;
        } else {
            rc = bench_run_all(&b);
        }
    }
    bench_free(&o, b.send);
    bench_free(&o, b.recv);
    free(b.v);
    dt_comm_destroy(c);
    return rc;
}

int cli_bench(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "comm")) return cli_bench_comm(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "peak")) return cli_bench_peak(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: dtrain bench comm [options]   (see dtrain bench comm --help)\n"
               "       dtrain bench peak [options]   (see dtrain bench peak --help)\n");
        return 0;
    }
    fprintf(stderr, "usage: dtrain bench comm|peak [options]\n");
    return CLI_EXIT_USAGE;
}
