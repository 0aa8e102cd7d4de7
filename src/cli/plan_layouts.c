/*
 * `dtrain plan` for a model on a cluster: which layout (tp, cp, dp, pp,
 * ZeRO, micro-batches, schedule, recomputation) fits and is fastest, and
 * why (src/plan/plan.h).
 *
 *   dtrain plan --model gpt2-xl --global-batch 512 --nodes 8 --ranks-per-node 8 \
 *       --mem-per-rank 80 --link-model nvlink-ib
 *
 * The compute rate is stated (--tflops), a GPU preset's (half the bf16
 * dense peak of the class the link preset names), or measured here: a
 * layer of the model forward and backward at one sequence (of at most
 * DT_PLAN_MEASURE_T tokens) on the cores a rank of this host would get,
 * announced with what it costs before it runs. Flags take `--flag value`
 * or `--flag=value` (cli/flag_value.c).
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/parse.h"
#include "core/str.h"
#include "core/timer.h"
#include "parallel/pipeline/partition_cost.h"
#include "plan/plan.h"
#include "sim/links.h"
#include "train/config/config.h"

#define MEASURE_MAX_GIB 4
#define GIB (1024.0 * 1024.0 * 1024.0)
#define PROGRESS_S 5.0      /* a line on stderr this often while layouts are weighed */
#define LARGE_WORLD 65536L
#define MODEL_ARGS 48       /* the model's flags and values, for the trainer's option table */

typedef struct {
    long nodes, per_node, batch, top;
    long tp, cp, pp, zero, micro, ep; /* pinned; -1: free */
    int rc, sched;
    double mem_gib, tflops, moe_skew;
    const char *links;
    int json, fp32;
    char *model_argv[MODEL_ARGS];
    int model_argc;
} plan_opts;

void cli_plan_layouts_flags(FILE *f)
{
    fprintf(f,
            "  --global-batch N     sequences a step, over all ranks (required)\n"
            "  --nodes N            hosts (required)\n"
            "  --ranks-per-node K   ranks a host; tensor parallelism stays inside one (required;\n"
            "                       nodes x K at most 1048576 ranks)\n"
            "  --mem-per-rank GiB   memory a rank may use (required)\n"
            "  --model NAME         tiny|gpt2|gpt2-medium|gpt2-large|gpt2-xl|bench|mixtral-mini|\n"
            "                       deepseek-moe-mini|llama3-1b|llama3-8b|llama3-70b|llama3-405b\n"
            "                       (default gpt2), or the sizes; --seq-len T (default the\n"
            "                       block size)\n"
            "  --arch gpt2|llama, --n-kv-head N (--num-query-groups), --ffn-hidden-size F,\n"
            "  --tie-word-embeddings[=0|1]\n"
            "                       the Llama family's options (as `dtrain train` takes them)\n"
            "  --num-experts E, --moe-router-topk K, --moe-ffn-hidden-size F\n"
            "                       a mixture of experts (as `dtrain train` takes them)\n"
            "  --link-model M       builtin (default: this machine's calibration), a file from\n"
            "                       `dtrain bench comm --calibrate`, or a preset:\n");
    dt_sim_links_help(f);
    fprintf(f,
            "  --tflops X           sustained TFLOP/s of a rank's matrix products (default:\n"
            "                       half of a preset's GPU peak, or measured on this host:\n"
            "                       a layer of the model timed before planning, which says\n"
            "                       what it costs; --tflops skips it)\n"
            "  --fp32               plan fp32 training (default: bf16 mixed precision)\n"
            "  --moe-skew X         with experts: the busiest expert-parallel rank's rows over\n"
            "                       the mean, an assumption (default 1.3; 1: a balanced router)\n"
            "  --top K              layouts printed (default 5)\n"
            "  --tp N, --cp N, --pp N, --ep N (--expert-model-parallel-size), --zero-stage S,\n"
            "  --micro-batch B, --recompute MODE, --pp-schedule KIND\n"
            "                       weigh only layouts with these\n"
            "  --json               the result as JSON\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "dtrain plan: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nRun 'dtrain plan --help' for usage.\n");
    va_end(ap);
    return CLI_EXIT_USAGE;
}

/* The flag's own spelling when a is one of the model's (they go to the
 * trainer's option table), else NULL. */
static const char *model_flag(const char *a)
{
    static const char *flags[] = {"--model", "--n-layer", "--n-head", "--n-embd", "--vocab-size",
                                  "--block-size", "--seq-len", "--blocks", "--num-experts",
                                  "--moe-router-topk", "--moe-ffn-hidden-size", "--arch",
                                  "--n-kv-head", "--num-query-groups", "--ffn-hidden-size",
                                  "--rope-theta", "--rotary-base", "--norm-eps"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(a, flags[i])) return flags[i];
    return NULL;
}

static int parse_long(const char *flag, const char *v, long lo, long hi, long *out)
{
    if (dt_parse_long(v, lo, hi, out) == 0) return 0;
    return usage_error("%s takes %ld..%ld, not %s", flag, lo, hi, v);
}

/* --tp, --cp, --pp, --zero-stage, --micro-batch, --ep, --recompute, --pp-schedule:
 * only layouts with those. 1 when a is one of them (0 or the usage exit
 * in *rc), else 0. */
static int parse_pin(plan_opts *o, const char *a, const char *v, int *rc)
{
    const char *names[] = {"--tp", "--cp", "--pp", "--zero-stage", "--micro-batch", "--ep",
                           "--expert-model-parallel-size"};
    long *at[] = {&o->tp, &o->cp, &o->pp, &o->zero, &o->micro, &o->ep, &o->ep};
    const long hi[] = {4096, 4096, 64, 3, 1L << 20, DT_MOE_MAX_EXPERTS, DT_MOE_MAX_EXPERTS};
    for (int i = 0; i < 7; i++)
        if (!strcmp(a, names[i])) return *rc = parse_long(a, v, i == 3 ? 0 : 1, hi[i], at[i]), 1;
    if (!strcmp(a, "--recompute")) {
        dt_recompute mode;
        *rc = dt_recompute_parse(v, &mode) == 0
                  ? (o->rc = (int)mode, 0)
                  : usage_error("--recompute is none|selective|full, not %s", v);
        return 1;
    }
    if (!strcmp(a, "--pp-schedule")) {
        dt_pp_kind k;
        int ok = dt_pp_kind_parse(v, &k) == 0 &&
                 (k == DT_PP_1F1B || k == DT_PP_ZB1P || k == DT_PP_INTERLEAVED);
        o->sched = ok ? (int)k : -1;
        *rc = ok ? 0 : usage_error("--pp-schedule weighs 1f1b|zb1p|interleaved, not %s", v);
        return 1;
    }
    return 0;
}

static int parse_value(plan_opts *o, const char *a, const char *v)
{
    int rc;
    if (parse_pin(o, a, v, &rc)) return rc;
    if (!strcmp(a, "--global-batch")) return parse_long(a, v, 1, 1L << 30, &o->batch);
    if (!strcmp(a, "--nodes")) return parse_long(a, v, 1, 1 << 20, &o->nodes);
    if (!strcmp(a, "--ranks-per-node")) return parse_long(a, v, 1, 4096, &o->per_node);
    if (!strcmp(a, "--top")) return parse_long(a, v, 1, 1000, &o->top);
    if (!strcmp(a, "--link-model")) return o->links = v, 0;
    if (!strcmp(a, "--mem-per-rank") || !strcmp(a, "--tflops")) {
        double *d = !strcmp(a, "--tflops") ? &o->tflops : &o->mem_gib;
        if (dt_parse_double(v, 1e-6, 1e9, d))
            return usage_error("%s wants a positive number, not %s", a, v);
        return 0;
    }
    if (!strcmp(a, "--moe-skew")) {
        if (dt_parse_double(v, 1, 1e3, &o->moe_skew))
            return usage_error("--moe-skew is the busiest rank's rows over the mean, at least "
                               "1 (a balanced router), not %s", v);
        return 0;
    }
    return usage_error("unknown option %s", a);
}

static int parse(int argc, char **argv, plan_opts *o)
{
    memset(o, 0, sizeof *o);
    o->top = 5;
    o->tp = o->cp = o->pp = o->zero = o->micro = o->ep = -1;
    o->moe_skew = DT_MOE_SKEW;
    o->rc = o->sched = -1;
    o->links = "builtin";
    o->model_argv[o->model_argc++] = "plan";
    for (int i = 1; i < argc; i++) {
        char a[64];
        const char *eq = cli_flag_split(argv[i], a, sizeof a), *m = model_flag(a);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return cli_plan_usage(stdout), 1;
        if (!strcmp(a, "--tie-word-embeddings")) { /* its value, if any, in the same word */
            if (o->model_argc + 1 >= MODEL_ARGS) return usage_error("too many model options");
            o->model_argv[o->model_argc++] = argv[i];
            continue;
        }
        int *on = !strcmp(a, "--json") ? &o->json : !strcmp(a, "--fp32") ? &o->fp32 : NULL;
        if (on && eq) return usage_error("%s takes no value", a);
        if (on) {
            *on = 1;
            continue;
        }
        const char *v = cli_flag_value(argc, argv, &i, eq);
        if (!v) return usage_error("%s needs a value", a);
        if (m && o->model_argc + 2 >= MODEL_ARGS) return usage_error("too many model options");
        if (m) {
            o->model_argv[o->model_argc++] = (char *)m;
            o->model_argv[o->model_argc++] = (char *)v;
            continue;
        }
        int rc = parse_value(o, a, v);
        if (rc) return rc;
    }
    const char *missing = !o->batch ? "--global-batch" : !o->nodes ? "--nodes"
                          : !o->per_node ? "--ranks-per-node" : !o->mem_gib ? "--mem-per-rank"
                          : NULL;
    if (missing)
        return usage_error("the cluster and batch need %s (every one of --global-batch, "
                           "--nodes, --ranks-per-node and --mem-per-rank)", missing);
    if (o->nodes * o->per_node > DT_PLAN_MAX_RANKS)
        return usage_error("--nodes %ld x --ranks-per-node %ld is %ld ranks; plan weighs up to "
                           "%d (2^20: the most a dtrain job starts and the collectives' cost "
                           "model stands in for): use fewer nodes or fewer ranks a node",
                           o->nodes, o->per_node, o->nodes * o->per_node, DT_PLAN_MAX_RANKS);
    return 0;
}

/* The model's sizes through the trainer's option table (its presets),
 * checked as the trainer checks a run's options (the Llama family's
 * options without --arch llama are refused, not ignored). */
static int model_of(plan_opts *o, dt_plan_input *in)
{
    dt_train_config c;
    char err[512];
    if (cli_model_options(o->model_argv, &o->model_argc, MODEL_ARGS, &c, &in->model, &in->T, err,
                          sizeof err) ||
        dt_config_validate(&c, 1, err, sizeof err))
        return usage_error("%s", err);
    dt_strf(in->model_name, sizeof in->model_name, "%s", c.model);
    return 0;
}

/* The rate measured on the cores a rank of this host gets; with more
 * ranks than cores they take turns (step_time.c). Said before it starts,
 * with what it costs and the flag that skips it; refused where the
 * throwaway layers would hold more than MEASURE_MAX_GIB. */
static int measure_compute(const plan_opts *o, dt_plan_input *in)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores / o->per_node > 0 ? (int)(cores / o->per_node) : 1, tokens;
    double bytes, work;
    char err[512];
    dt_plan_measure_cost(&in->model, in->T, &tokens, &bytes, &work);
    if (bytes > MEASURE_MAX_GIB * GIB)
        return usage_error("no --tflops and no GPU preset, so the rate would be measured "
                           "here, but a layer of this model needs about %.1f GiB to time "
                           "(more than %d): state a rank's sustained rate with --tflops X, "
                           "or name a GPU preset with --link-model", bytes / GIB,
                           MEASURE_MAX_GIB);
    fprintf(stderr, "dtrain plan: measuring this host's compute rate (no --tflops, and "
            "--link-model %s names no GPU): a layer of the model forward and backward at %d "
            "tokens on %d thread%s, about %.2f GiB and %.3g TFLOP, then at most %.0f s more; "
            "--tflops X states the rate instead\n", o->links, tokens, threads,
            threads > 1 ? "s" : "", bytes / GIB, work / 1e12, DT_PP_COST_BUDGET_S);
    if (dt_plan_measure_flops(&in->model, in->T, in->bf16, threads, &in->flops, err, sizeof err))
        return fprintf(stderr, "dtrain plan: %s\n", err), 1;
    if (o->per_node > cores) in->cores = (int)cores;
    in->cpu_comm = o->per_node * threads >= cores;
    dt_strf(in->flops_source, sizeof in->flops_source, "measured: a layer at %d tokens on "
            "%d thread%s%s", tokens, threads, threads > 1 ? "s" : "",
            in->cores ? "; oversubscribed: the host's ranks take turns on its cores" : "");
    return 0;
}

static int cluster_of(const plan_opts *o, dt_plan_input *in)
{
    char err[512];
    in->nodes = (int)o->nodes;
    in->per_node = (int)o->per_node;
    in->batch = o->batch;
    in->mem = o->mem_gib * 1024.0 * 1024.0 * 1024.0;
    in->bf16 = !o->fp32;
    in->pin.tp = (int)o->tp, in->pin.cp = (int)o->cp, in->pin.pp = (int)o->pp;
    in->pin.zero = (int)o->zero, in->pin.B = (int)o->micro;
    in->pin.rc = o->rc, in->pin.sched = o->sched, in->pin.ep = (int)o->ep;
    in->moe_skew = o->moe_skew;
    if (dt_sim_links(o->links, &in->links, err, sizeof err)) return usage_error("%s", err);
    int gpu = dt_plan_gpu(o->links, &in->flops, &in->opt_Bps, in->flops_source,
                          sizeof in->flops_source);
    if (!gpu) in->opt_Bps = in->links.copy > 0 ? 2.0 / in->links.copy : 10e9;
    if (o->tflops > 0) {
        in->flops = o->tflops * 1e12;
        dt_strf(in->flops_source, sizeof in->flops_source, "stated");
        return 0;
    }
    return gpu ? 0 : measure_compute(o, in);
}

/* Lines on stderr while layouts are weighed: at the start where the
 * groups are large (each of their collectives is costed by running its
 * algorithm dry over that many ranks, about a second per LARGE_WORLD
 * ranks), then every PROGRESS_S. */
typedef struct {
    uint64_t start, last;
    long world;
} progress_clock;

static void progress(void *arg, long done, long total)
{
    progress_clock *c = arg;
    const uint64_t now = dt_now_ns();
    if (done == 0 && c->world >= LARGE_WORLD)
        fprintf(stderr, "dtrain plan: weighing %ld layouts of %ld ranks; their collectives are "
                "run dry over groups of up to %ld ranks, which takes minutes; a line at most "
                "every %.0f s says how far it is\n", total, c->world, c->world, PROGRESS_S);
    if ((double)(now - c->last) * 1e-9 < PROGRESS_S) return;
    c->last = now;
    fprintf(stderr, "dtrain plan: %ld of %ld layouts weighed in %.0f s\n", done, total,
            (double)(now - c->start) * 1e-9);
}

int cli_plan_layouts(int argc, char **argv)
{
    plan_opts o;
    dt_plan_input in;
    dt_plan_result r;
    char err[1024];
    memset(&in, 0, sizeof in);
    int rc = parse(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    if ((rc = model_of(&o, &in)) || (rc = cluster_of(&o, &in))) return rc;
    progress_clock clock = {dt_now_ns(), dt_now_ns(), o.nodes * o.per_node};
    in.progress = progress, in.progress_arg = &clock;
    in.show = (int)o.top;
    if (dt_plan_run(&in, &r, err, sizeof err)) {
        fprintf(stderr, "dtrain plan: %s\n", err);
        return strstr(err, "no layout") ? CLI_EXIT_USAGE : 1;
    }
    if (o.json) rc = dt_plan_print_json(stdout, &in, &r, (int)o.top);
    else dt_plan_print(stdout, &in, &r, (int)o.top);
    if (!rc && r.nfit == 0) {
        fprintf(stderr, "dtrain plan: no layout fits in the %g GiB a rank has (the nearest "
                "is above)\n", o.mem_gib);
        rc = 1;
    }
    dt_plan_result_free(&r);
    return rc ? 1 : 0;
}
