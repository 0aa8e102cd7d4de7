/*
 * `dtrain simulate`: a training step or one collective on a simulated
 * cluster of up to a million ranks, on this one process (src/sim).
 *
 *   dtrain simulate --collective KIND --bytes N --ranks P [...]
 *   dtrain simulate --ddp [--model NAME | sizes] --ranks P [...]
 *   dtrain simulate --layout --tp T --cp C --pp P [...] --ranks P [...]
 *
 * The model's sizes and the layout's flags go through the trainer's own
 * option table (presets included), so `--model gpt2 --tp 2` means here
 * what it means to `dtrain train`.
 */
#include "cli/cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/simulate.h"
#include "core/parse.h"
#include "parallel/context/cp.h"
#include "plan/plan.h"
#include "sim/links.h"
#include "sim/trace.h"
#include "train/config/config.h"
#include "train/dry_run.h"

typedef struct {
    const char *collective, *algo, *links, *trace;
    int ddp, layout, measure, mem_given, layout_flags;
    int cpu_comm; /* measured here with every core computing (dt_sim_layout_opts) */
    double cpu_share; /* measured here on a host with more ranks than cores */
    long ranks, per_host, nics, trace_ranks;
    long long bytes;
    double bucket_mb, flops, mem_GBps;
    char *model_argv[48]; /* "simulate", then the model's and layout's flags and values */
    int model_argc;
} sim_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain simulate --collective KIND --bytes N --ranks P [options]\n"
            "       dtrain simulate --ddp [--model NAME] --ranks P [options]\n"
            "\n"
            "Simulates, on this one process, ranks exchanging messages over a network of\n"
            "alpha-beta links: each rank's port into its host, each host's NIC, both\n"
            "directions apart; messages sharing a link share its bandwidth. Collectives run\n"
            "the real algorithms' schedules (those of `dtrain bench comm`).\n"
            "\n"
            "  --ranks P             ranks, 1..1048576 (required)\n"
            "  --ranks-per-node K    ranks on each host; P must be a multiple (default 1)\n"
            "  --nics-per-node N     NICs per host, rank r on NIC r %% N (default 1)\n"
            "  --link-model M        builtin (default), a preset, or a model file:\n");
    dt_sim_links_help(f);
    fprintf(f,
            "  --algo NAME|auto      the collective's algorithm (default auto: the cost\n"
            "                        model's cheapest, as a real run picks)\n"
            "\n"
            "One collective:\n"
            "  --collective KIND     allreduce|reduce_scatter|allgather|broadcast|alltoall\n"
            "  --bytes N             bytes, K/M/G suffixes (powers of 1024); for allgather,\n"
            "                        reduce_scatter and alltoall all ranks' data together\n"
            "\n"
            "A DDP training step (forward, backward with bucketed all-reduces, optimizer):\n"
            "  --ddp\n"
            "  --model NAME          tiny|gpt2|gpt2-medium|gpt2-large|gpt2-xl|bench|mixtral-mini|\n"
            "                        deepseek-moe-mini|llama3-1b|llama3-8b|llama3-70b|\n"
            "                        llama3-405b (default gpt2)\n"
            "  --n-layer, --n-head, --n-embd, --vocab-size (--vocab), --block-size,\n"
            "  --seq-len, --batch-size N   sizes, as `dtrain train` takes them (batch 8)\n"
            "  --blocks SPEC         a layer's blocks, as `dtrain train` takes them\n"
            "  --num-experts E, --moe-router-topk K, --moe-ffn-hidden-size F\n"
            "                        a mixture of experts, as `dtrain train` takes them\n"
            "  --arch gpt2|llama, --n-kv-head N (--num-query-groups), --ffn-hidden-size F,\n"
            "  --tie-word-embeddings[=0|1]   the Llama family's, as `dtrain train` takes them\n"
            "  --bucket-mb X         DDP's bucket cap in MiB (default 25)\n"
            "  --flops-per-s F       sustained compute rate per rank (default 1e14)\n"
            "  --mem-GBps B          memory bandwidth for the optimizer (default 1500)\n"
            "  --flops-per-s measure the rate measured here (a layer on this host's cores\n"
            "                        split among its --ranks-per-node ranks; more ranks\n"
            "                        than cores share them, among those computing at each\n"
            "                        instant); the optimizer\n"
            "                        then streams at the link model's copy rate unless\n"
            "                        --mem-GBps is given\n"
            "  --trace FILE          Perfetto / Chrome trace of the step\n"
            "  --trace-ranks N       most ranks in the trace; above, a sample (default 64)\n"
            "\n"
            "A step of a layout (ranks = tp x cp x dp x pp in Megatron's order; the real\n"
            "pipeline schedule, tensor parallelism's reduces, DDP or ZeRO over the replicas):\n"
            "  --layout              and the model's flags and --bucket-mb as above\n"
            "  --tp T, --cp C, --pp P, --dp D   the mesh (D: ranks / (T C P) when left out)\n"
            "  --batch-size B (--micro-batch B), --grad-accum M   a rank's micro-batches\n"
            "  --pp-schedule S       1f1b (default), gpipe, zb1p, interleaved, naive\n"
            "  --pp-virtual V        interleaved: chunks per pipeline rank\n"
            "  --zero-stage Z        0 (DDP, default), 1, 2, 3\n"
            "  --zero-prefetch N     ZeRO-3: layers gathered ahead (default 1)\n"
            "  --sequence-parallel   boundary activations split over tp\n"
            "  --ep N                expert parallelism (--expert-model-parallel-size): each\n"
            "                        moe layer's all-to-alls over N consecutive dp ranks, the\n"
            "                        busiest taking 1.3 x the mean rows (an assumption)\n"
            "\n"
            "A run that lasts prints on stderr what it is doing, how far it has got and about\n"
            "how long it has left, every 10 s (DTRAIN_SIM_PROGRESS_S=N: every N s).\n"
            "\n"
            "examples:\n"
            "  dtrain simulate --collective allreduce --bytes 256M --ranks 64 "
            "--ranks-per-node 8 --link-model nvlink-ib\n"
            "  dtrain simulate --ddp --model gpt2 --ranks 10000 --ranks-per-node 8 "
            "--link-model nvlink-ib --trace step.json\n"
            "  dtrain simulate --layout --model gpt2 --tp 4 --pp 4 --grad-accum 8 "
            "--ranks 10000 --ranks-per-node 8 --link-model nvlink-ib\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("dtrain simulate: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nRun 'dtrain simulate --help' for usage.\n", stderr);
    return CLI_EXIT_USAGE;
}

/* "4096", "256K", "1M", "2G" (powers of 1024). */
static int parse_bytes(const char *s, long long *out)
{
    char num[64];
    size_t n = strlen(s);
    long long unit = 1;
    if (n == 0 || n >= sizeof num) return -1;
    memcpy(num, s, n + 1);
    const char *units = "KMG";
    const char *u = strchr(units, num[n - 1]);
    if (u && num[n - 1]) {
        for (const char *k = units; k <= u; k++) unit *= 1024;
        num[n - 1] = '\0';
    }
    long long v;
    if (dt_parse_integral(num, 1, (1ll << 50) / unit, &v)) return -1;
    *out = v * unit;
    return 0;
}

/* Flags read by the trainer's option table; from layout_first on, the
 * layout's (refused in the other modes). */
static const char *const model_flags[] = {"--model", "--n-layer", "--n-head", "--n-embd",
                                          "--vocab-size", "--block-size", "--seq-len",
                                          "--batch-size", "--blocks", "--num-experts",
                                          "--moe-router-topk", "--moe-ffn-hidden-size",
                                          "--arch", "--n-kv-head", "--num-query-groups",
                                          "--ffn-hidden-size", "--rope-theta", "--rotary-base",
                                          "--norm-eps",
                                          "--tp", "--cp", "--dp", "--pp",
                                          "--grad-accum", "--pp-schedule", "--pp-virtual",
                                          "--zero-stage", "--zero-prefetch", "--ep"};
enum { layout_first = 19 };

/* A flag of the model's or the layout's, kept for the trainer's option
 * table. */
static int model_flag(sim_opts *o, const char *a, const char *v)
{
    if (!strcmp(a, "--vocab")) a = "--vocab-size";
    if (!strcmp(a, "--micro-batch")) a = "--batch-size";
    if (!strcmp(a, "--expert-model-parallel-size")) a = "--ep";
    for (size_t i = 0; i < sizeof model_flags / sizeof model_flags[0]; i++)
        if (!strcmp(a, model_flags[i]) && o->model_argc + 2 < 48) {
            o->model_argv[o->model_argc++] = (char *)model_flags[i];
            o->model_argv[o->model_argc++] = (char *)v;
            o->layout_flags |= i >= layout_first;
            return 1;
        }
    return 0;
}

static int number(const char *a, const char *v, sim_opts *o)
{
    struct { const char *flag; long *out; long lo, hi; } ints[] = {
        {"--ranks", &o->ranks, 1, 1 << 20}, {"--ranks-per-node", &o->per_host, 1, 1 << 20},
        {"--nics-per-node", &o->nics, 1, 1 << 20}, {"--trace-ranks", &o->trace_ranks, 1, 4096}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (!strcmp(a, ints[i].flag)) {
            if (dt_parse_long(v, ints[i].lo, ints[i].hi, ints[i].out) == 0) return 1;
            return usage_error("%s takes a whole number in %ld..%ld, not '%s'", a, ints[i].lo,
                               ints[i].hi, v), -1;
        }
    struct { const char *flag; double *out; } dbls[] = {
        {"--bucket-mb", &o->bucket_mb}, {"--flops-per-s", &o->flops}, {"--mem-GBps", &o->mem_GBps}};
    for (size_t i = 0; i < sizeof dbls / sizeof dbls[0]; i++)
        if (!strcmp(a, dbls[i].flag)) {
            o->mem_given |= dbls[i].out == &o->mem_GBps;
            if (dbls[i].out == &o->flops && !strcmp(v, "measure")) return o->measure = 1;
            if (dt_parse_double(v, 1e-9, 1e30, dbls[i].out) == 0) return 1;
            return usage_error("%s takes a positive number, not '%s'", a, v), -1;
        }
    if (!strcmp(a, "--bytes")) {
        if (parse_bytes(v, &o->bytes) == 0) return 1;
        return usage_error("--bytes takes a size such as 4096, 64K, 256M or 1G, not '%s'", v), -1;
    }
    return 0;
}

static int text(const char *a, const char *v, sim_opts *o)
{
    struct { const char *flag; const char **out; } strs[] = {
        {"--collective", &o->collective}, {"--algo", &o->algo}, {"--link-model", &o->links},
        {"--trace", &o->trace}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (!strcmp(a, strs[i].flag)) {
            *strs[i].out = v;
            return 1;
        }
    return model_flag(o, a, v);
}

/* 0, 1 after --help, or CLI_EXIT_USAGE (message printed). */
static int parse(int argc, char **argv, sim_opts *o)
{
    *o = (sim_opts){.links = "builtin", .per_host = 1, .nics = 1, .trace_ranks = 64,
                    .bucket_mb = 25, .flops = 1e14, .mem_GBps = 1500};
    o->model_argv[o->model_argc++] = "simulate";
    for (int i = 1; i < argc; i++) {
        char a[64];
        const char *eq = cli_flag_split(argv[i], a, sizeof a);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 1;
        const int bare = !strcmp(a, "--ddp") || !strcmp(a, "--layout") ||
                         !strcmp(a, "--sequence-parallel");
        if (bare && eq) return usage_error("%s takes no value (got '%s')", a, eq);
        if (!strcmp(a, "--ddp") || !strcmp(a, "--layout")) {
            *(a[2] == 'd' ? &o->ddp : &o->layout) = 1;
            continue;
        }
        if (!strcmp(a, "--tie-word-embeddings") && o->model_argc + 1 < 48) {
            o->model_argv[o->model_argc++] = argv[i]; /* its value, if any, in the word */
            continue;
        }
        if (!strcmp(a, "--sequence-parallel") && o->model_argc + 1 < 48) {
            o->model_argv[o->model_argc++] = "--sequence-parallel=1";
            o->layout_flags = 1;
            continue;
        }
        if (strncmp(a, "--", 2)) return usage_error("unexpected argument '%s'", a);
        const char *v = cli_flag_value(argc, argv, &i, eq);
        if (!v) return usage_error("%s needs a value", a);
        int rc = number(a, v, o);
        if (rc == 0) rc = text(a, v, o);
        if (rc < 0) return CLI_EXIT_USAGE;
        if (rc == 0) return usage_error("unknown option %s", a);
    }
    if (!o->ranks) return usage_error("--ranks P is needed (how many ranks to simulate)");
    if (o->ddp + o->layout + !!o->collective != 1)
        return usage_error("give one of --collective KIND (with --bytes N), --ddp or --layout");
    if (o->collective && !o->bytes) return usage_error("--collective needs --bytes N");
    if (o->collective && (o->model_argc > 1 || o->trace))
        return usage_error("--model, the sizes and --trace go with --ddp or --layout");
    if (!o->collective && o->bytes)
        return usage_error("--bytes goes with --collective, not --ddp or --layout");
    if (o->layout_flags && !o->layout)
        return usage_error("--tp, --cp, --dp, --pp, --ep, --grad-accum, --pp-schedule, "
                           "--pp-virtual, --zero-stage, --zero-prefetch and --sequence-parallel "
                           "go with --layout");
    return 0;
}

static int setup(const sim_opts *o, dt_sim_world *w, sim_progress *prog)
{
    dt_cost_model m;
    char err[1024];
    if (dt_sim_links(o->links, &m, err, sizeof err) ||
        dt_sim_world_init(w, (int)o->ranks, (int)o->per_host, &m, err, sizeof err))
        return usage_error("%s", err);
    w->progress = (dt_sim_progress){sim_progress_tell, prog};
    if (o->nics > o->per_host) {
        dt_sim_world_free(w);
        return usage_error("--nics-per-node %ld exceeds --ranks-per-node %ld: at most one NIC "
                           "per rank", o->nics, o->per_host);
    }
    return 0;
}

static int run_collective(const sim_opts *o, sim_progress *prog)
{
    dt_sim_world w;
    dt_coll_kind k;
    char err[1024];
    if (dt_sim_coll_kind(o->collective, &k, err, sizeof err)) return usage_error("%s", err);
    int rc = setup(o, &w, prog);
    if (rc) return rc;
    dt_sim_bench b;
    rc = dt_sim_bench_coll(&w, (int)o->nics, o->collective, o->algo, (size_t)o->bytes, &b, err,
                           sizeof err);
    if (rc == 0) sim_report_collective(stdout, &w, (int)o->nics, o->collective, &b);
    dt_sim_world_free(&w);
    if (rc) return strstr(err, "--algo") ? usage_error("%s", err)
                                         : (fprintf(stderr, "dtrain simulate: %s\n", err), 1);
    return 0;
}

/* The model's sizes and the layout's flags through the trainer's options
 * (its presets); cfg and T checked. */
static int model_config(sim_opts *o, dt_train_config *c, dt_gpt_config *cfg, int *T)
{
    char err[512];
    if (cli_model_options(o->model_argv, &o->model_argc, 48, c, cfg, T, err, sizeof err))
        return usage_error("%s", err);
    return 0;
}

/* --flops-per-s measure: a layer's rate on the cores a rank of a host gets
 * (shared when the host's ranks outnumber its cores), and unless given,
 * the optimizer's memory rate from the link model's copy rate. With no
 * core to spare, the collectives are CPU work taking turns with compute. */
static int measure(sim_opts *o, const dt_gpt_config *cfg, int T, const dt_sim_world *w)
{
    if (!o->measure) return 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores / o->per_host > 0 ? (int)(cores / o->per_host) : 1;
    char err[512];
    if (dt_plan_measure_flops(cfg, T, 0, threads, &o->flops, err, sizeof err))
        return fprintf(stderr, "dtrain simulate: %s\n", err), 1;
    /* More ranks than cores: each computes at a core's rate while the
     * host's cores go round the ranks computing at the instant. */
    if (o->per_host > cores) o->cpu_share = (double)cores;
    /* Every core computes: the collectives' copies take turns with it. */
    o->cpu_comm = o->per_host * threads >= cores;
    const double copy = w->model.copy;
    if (!o->mem_given && copy > 0) o->mem_GBps = 2.0 / copy / 1e9;
    printf("compute        measured: %.3g FLOP/s a rank (a layer on %d thread%s%s%s)\n",
           o->flops, threads, threads > 1 ? "s" : "",
           o->per_host > cores ? "; the host's cores shared among its ranks computing at "
                                 "each instant" : "",
           o->cpu_comm ? "; no core to spare: collectives take turns with compute" : "");
    return 0;
}

static int write_trace(const sim_opts *o, const dt_sim_trace *t, int ranks)
{
    char err[1200];
    if (dt_sim_trace_write(t, o->trace, err, sizeof err)) {
        fprintf(stderr, "dtrain simulate: %s\n", err);
        return 1;
    }
    printf("trace          %s: %d rank%s", o->trace, dt_sim_trace_kept(t),
           dt_sim_trace_kept(t) == 1 ? "" : "s");
    if (dt_sim_trace_kept(t) < ranks)
        printf(" of %d (a sample: the first and last hosts' and a stride between; "
               "--trace-ranks N for more)", ranks);
    printf("\n");
    return 0;
}

/* A failed run: exit 2 for what the user can change (an algorithm), 1
 * otherwise. */
static int failed(const char *err)
{
    if (strstr(err, "--algo")) return usage_error("%s", err);
    fprintf(stderr, "dtrain simulate: %s\n", err);
    return 1;
}

/* The mesh against the model as `dtrain train --dry-run` and `dtrain
 * plan` check it: the strategy kind's places (tp's slices, cp's cut of
 * the sequence and sp's of the rows, as a run's allocation checks them). */
static int model_checks(const dt_train_config *c, const dt_gpt_config *cfg, int ranks, char *err,
                        size_t len)
{
    dt_gpt layout;
    if (dt_gpt_create_layout(&layout, cfg, DT_PREC_F32, err, len)) return -1;
    dt_places pl;
    int rc = dt_dry_run_places(c, &layout, ranks, &pl, err, len);
    if (rc == 0) dt_places_free(&pl);
    dt_gpt_destroy(&layout);
    return rc;
}

/* The checks `dtrain train` makes of a run over `ranks` ranks (the
 * options together, the strategy's sizes), then the model's: the same
 * functions, so that simulate, train and plan take the same layouts. */
static int train_checks(dt_train_config *c, const dt_gpt_config *cfg, int ranks)
{
    char err[1024];
    int dp;
    if (dt_config_data_parallel_size(c, ranks, &dp, err, sizeof err) ||
        dt_config_validate(c, dp, err, sizeof err) || model_checks(c, cfg, ranks, err, sizeof err))
        return usage_error("%s", err);
    return 0;
}

/* The layout's options from the trainer's configuration (its defaults:
 * interleaved takes two chunks a rank unless told), checked first for
 * what the simulator can place on `--ranks` ranks, then as the trainer
 * checks a run. */
static int layout_opts(sim_opts *o, dt_sim_layout_opts *l)
{
    dt_train_config c;
    *l = (dt_sim_layout_opts){.algo = o->algo, .nics = (int)o->nics,
                              .bucket_bytes = (size_t)(o->bucket_mb * 1048576.0)};
    int rc = model_config(o, &c, &l->cfg, &l->seq);
    if (rc) return rc;
    dt_parallel_opts p = dt_config_parallel_opts(&c);
    l->tp = p.tp, l->cp = p.cp, l->dp = p.dp, l->pp = p.pp;
    l->V = p.pp > 1 ? p.pp_virtual : 1;
    l->micro = c.batch_size, l->accum = p.accum, l->sp = p.sp;
    l->zero = p.zero.stage, l->prefetch = p.zero.prefetch;
    l->ep = p.ep, l->moe_skew = DT_MOE_SKEW;
    if (dt_pp_kind_parse(c.pp_schedule, &l->sched))
        return usage_error("--pp-schedule '%s' is not one of 1f1b, gpipe, zb1p, interleaved, "
                           "naive", c.pp_schedule);
    char err[1024];
    if (dt_sim_layout_check(l, (int)o->ranks, err, sizeof err)) return usage_error("%s", err);
    return train_checks(&c, &l->cfg, (int)o->ranks);
}

/* A step: the layout's, or with --ddp data parallelism alone (its
 * defaults, tp = cp = pp = 1 and no ZeRO) with DDP's own report. */
static int run_step(sim_opts *o, sim_progress *prog)
{
    dt_sim_layout_opts l;
    int rc = layout_opts(o, &l);
    dt_sim_world w;
    if (rc || (rc = setup(o, &w, prog))) return rc;
    if ((rc = measure(o, &l.cfg, l.seq, &w))) return dt_sim_world_free(&w), rc;
    l.flops_per_s = o->flops, l.mem_GBps = o->mem_GBps, l.cpu_comm = o->cpu_comm;
    l.cpu_share = o->cpu_share;
    dt_sim_trace *t = o->trace ? dt_sim_trace_new(w.ranks, w.per_host, (int)o->trace_ranks) : NULL;
    dt_sim_layout out;
    char err[1024];
    if (o->trace && !t) {
        rc = 1;
        snprintf(err, sizeof err, "out of memory for the trace");
    } else {
        rc = dt_sim_layout_run(&w, &l, t ? dt_sim_trace_span : NULL, t, &out, err, sizeof err);
    }
    if (rc == 0 && o->ddp) sim_report_ddp(stdout, &w, &l, &out);
    else if (rc == 0) sim_report_layout(stdout, &w, &l, &out);
    if (rc == 0 && t) rc = write_trace(o, t, w.ranks);
    else if (rc) rc = failed(err);
    dt_sim_trace_free(t);
    dt_sim_world_free(&w);
    return rc;
}

int cli_simulate(int argc, char **argv)
{
    sim_opts o;
    sim_progress prog;
    char err[512];
    int rc = parse(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    if (sim_progress_init(&prog, err, sizeof err)) return usage_error("%s", err);
    return o.layout || o.ddp ? run_step(&o, &prog) : run_collective(&o, &prog);
}
