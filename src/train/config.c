/* Training configuration: defaults, presets, JSON (dtrain + DeepSpeed keys),
 * flags, validation, the learning-rate schedule.
 *
 * One table (`options` below) describes every option once: its flag, its
 * DeepSpeed alias, type, field, range and help. Flags, JSON keys, --help and
 * the range checks of dt_config_validate are all driven from it.
 *
 * DeepSpeed mapping (what a DeepSpeed config means in dtrain):
 *   train_batch_size, train_micro_batch_size_per_gpu (--batch-size),
 *   gradient_accumulation_steps (--grad-accum): see dt_config_validate.
 *   gradient_clipping -> grad_clip; steps_per_print -> print_every.
 *   optimizer.type AdamW -> adamw; Adam -> adamw, because DeepSpeed's Adam
 *     decouples weight decay unless params.adam_w_mode is false (then adam,
 *     L2 decay); SGD -> sgd. params: lr, betas [b1, b2], eps, weight_decay,
 *     momentum; torch_adam is an implementation choice and is ignored.
 *   scheduler.type WarmupLR -> constant, WarmupDecayLR -> linear (decays to
 *     warmup_min_lr at total_num_steps, as DeepSpeed does), WarmupCosineLR ->
 *     cosine. params: warmup_max_lr -> lr, warmup_min_lr -> min_lr,
 *     warmup_num_steps -> warmup_steps, total_num_steps -> steps,
 *     cos_min_ratio -> min_lr_ratio. Params that are absent keep dtrain's
 *     values (not DeepSpeed's defaults). Differences: dtrain warms up
 *     linearly from 0 (DeepSpeed from warmup_min_lr / warmup_min_ratio, and
 *     by default along a log curve: a warning says so).
 *   bf16.enabled -> dtype bf16 (false -> fp32); fp16.enabled true is an
 *     error (no loss scaling yet). zero_optimization.stage -> zero_stage;
 *     its other keys and wall_clock_breakdown are accepted silently.
 * Within one file DeepSpeed's optimizer section is applied first, then its
 * other keys (so a scheduler's warmup_max_lr beats optimizer.params.lr, as
 * in DeepSpeed), then dtrain's own keys, which win over both. */
#include "train/config.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/file.h"
#include "core/log.h"
#include "core/str.h"
#include "dtrain/comm.h"
#include "parallel/compress.h"
#include "parallel/registry.h"
#include "core/parse.h"

/* ---- the option table ------------------------------------------------- */

typedef enum { T_INT, T_LONG, T_U64, T_DBL, T_BOOL, T_STR, T_CHOICE, T_ACTION } opt_type;

enum {
    O_NOVAL = 1,    /* takes no value (--help) */
    O_OPTVAL = 2,   /* value optional: --resume or --resume=DIR */
    O_MINOPEN = 4,  /* value must be > min, not >= */
    O_MAXOPEN = 8,  /* value must be < max, not <= */
    O_EMPTYOK = 16, /* T_CHOICE: "" is allowed too */
};

enum { G_MODEL, G_DATA, G_BATCH, G_OPTIM, G_RUN, G_CKPT, G_LOG, G_MISC, G_COUNT };
static const char *const group_titles[G_COUNT] = {
    "Model", "Data", "Batch", "Optimizer and schedule", "Run",
    "Evaluation and checkpoints", "Logging", "Other"};

typedef struct opt {
    const char *flag;  /* without "--"; its snake_case form is the JSON key */
    const char *alias; /* DeepSpeed's JSON key for the same setting, or NULL */
    opt_type type;
    size_t off, size;  /* the field in dt_train_config */
    double min, max;
    const char *meta;  /* metavar in --help; for T_CHOICE the choices a|b|c */
    int (*hook)(dt_train_config *c, const char *who, char *err, size_t n);
    unsigned flags;
    int group;
    const char *help;
} opt;

static int hook_model(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_min_lr(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_min_lr_ratio(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_resume(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_compress(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_comm_algo(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_strategy(dt_train_config *c, const char *who, char *err, size_t n);

#define FIELD(f) offsetof(dt_train_config, f), sizeof(((dt_train_config *)0)->f)
#define IMAX 2147483647.0
#define LMAX 1e15 /* longs: far beyond any real run, and exact in a double */
#define OPT(g, flag, alias, type, f, lo, hi, meta, hook, fl, help) \
    {flag, alias, type, FIELD(f), lo, hi, meta, hook, fl, g, help}
#define ACT(g, flag, meta, fl, help) {flag, NULL, T_ACTION, 0, 0, 0, 0, meta, NULL, fl, g, help}

static const opt options[] = {
    OPT(G_MODEL, "model", NULL, T_CHOICE, model, 0, 0,
        "tiny|gpt2|gpt2-medium|gpt2-large|gpt2-xl|bench", hook_model, O_EMPTYOK,
        "preset; sets the sizes not given explicitly (\"\" = none)"),
    OPT(G_MODEL, "n-layer", NULL, T_INT, n_layer, 1, IMAX, "N", NULL, 0, "transformer blocks"),
    OPT(G_MODEL, "n-head", NULL, T_INT, n_head, 1, IMAX, "N", NULL, 0, "attention heads"),
    OPT(G_MODEL, "n-embd", NULL, T_INT, n_embd, 1, IMAX, "N", NULL, 0,
        "embedding width, a multiple of --n-head"),
    OPT(G_MODEL, "vocab-size", NULL, T_INT, vocab_size, 0, IMAX, "N", NULL, 0,
        "vocabulary; 0 = from --init or the data"),
    OPT(G_MODEL, "block-size", NULL, T_INT, block_size, 1, IMAX, "N", NULL, 0,
        "context length (position embeddings)"),
    OPT(G_MODEL, "init", NULL, T_STR, init, 0, 0, "FILE", NULL, 0,
        "start from these safetensors weights"),
    OPT(G_DATA, "data", NULL, T_STR, data, 0, 0, "FILE", NULL, 0,
        "training tokens: llm.c .bin shard or text file"),
    OPT(G_DATA, "val-data", NULL, T_STR, val_data, 0, 0, "FILE", NULL, 0,
        "validation tokens (default: the tail of --data)"),
    OPT(G_DATA, "val-fraction", NULL, T_DBL, val_fraction, 0, 1, "X", NULL, O_MAXOPEN,
        "share of --data held out when no --val-data"),
    OPT(G_DATA, "shuffle", NULL, T_BOOL, shuffle, 0, 1, "0|1", NULL, 0,
        "shuffle the order of sequences"),
    OPT(G_BATCH, "batch-size", "train_micro_batch_size_per_gpu", T_INT, batch_size, 1, IMAX,
        "N", NULL, 0, "sequences per rank per micro-batch"),
    OPT(G_BATCH, "seq-len", NULL, T_INT, seq_len, 0, IMAX, "N", NULL, 0,
        "tokens per sequence; 0 = --block-size"),
    OPT(G_BATCH, "grad-accum", "gradient_accumulation_steps", T_INT, grad_accum, 1, IMAX, "N",
        NULL, 0, "micro-batches per optimizer step"),
    OPT(G_BATCH, "train-batch-size", NULL, T_LONG, train_batch_size, 0, LMAX, "N", NULL, 0,
        "global sequences per step; 0 = batch x accum x ranks"),
    OPT(G_OPTIM, "steps", NULL, T_LONG, steps, 1, LMAX, "N", NULL, 0, "optimizer steps"),
    OPT(G_OPTIM, "optimizer", NULL, T_CHOICE, optimizer, 0, 0, "adamw|adam|sgd", NULL, 0,
        "adam and sgd decay weights as L2"),
    OPT(G_OPTIM, "lr", NULL, T_DBL, lr, 0, INFINITY, "X", NULL, 0, "peak learning rate"),
    OPT(G_OPTIM, "min-lr", NULL, T_DBL, min_lr, 0, INFINITY, "X", hook_min_lr, 0,
        "floor of the cosine or linear decay"),
    OPT(G_OPTIM, "min-lr-ratio", NULL, T_DBL, min_lr_ratio, 0, 1, "X", hook_min_lr_ratio, 0,
        "floor as a fraction of --lr (instead of --min-lr)"),
    OPT(G_OPTIM, "lr-schedule", NULL, T_CHOICE, lr_schedule, 0, 0, "constant|cosine|linear",
        NULL, 0, "decay after the warmup"),
    OPT(G_OPTIM, "warmup-steps", NULL, T_LONG, warmup_steps, 0, LMAX, "N", NULL, 0,
        "steps of linear warmup from 0"),
    OPT(G_OPTIM, "beta1", NULL, T_DBL, beta1, 0, 1, "X", NULL, O_MAXOPEN, "Adam beta1"),
    OPT(G_OPTIM, "beta2", NULL, T_DBL, beta2, 0, 1, "X", NULL, O_MAXOPEN, "Adam beta2"),
    OPT(G_OPTIM, "eps", NULL, T_DBL, eps, 0, INFINITY, "X", NULL, O_MINOPEN, "Adam epsilon"),
    OPT(G_OPTIM, "weight-decay", NULL, T_DBL, weight_decay, 0, INFINITY, "X", NULL, 0,
        "weight decay (matrices only)"),
    OPT(G_OPTIM, "momentum", NULL, T_DBL, momentum, 0, 1, "X", NULL, O_MAXOPEN, "SGD momentum"),
    OPT(G_OPTIM, "grad-clip", "gradient_clipping", T_DBL, grad_clip, 0, INFINITY, "X", NULL, 0,
        "max global gradient norm; 0 = off"),
    OPT(G_RUN, "dtype", NULL, T_CHOICE, dtype, 0, 0, "fp32|bf16", NULL, 0,
        "compute type (bf16: fp32 master weights)"),
    OPT(G_RUN, "threads", NULL, T_INT, threads, 0, 65536, "N", NULL, 0,
        "compute threads per rank; 0 = all online cores"),
    OPT(G_RUN, "seed", NULL, T_U64, seed, 0, 0, "N", NULL, 0, "seed of init and shuffling"),
    OPT(G_RUN, "zero-stage", NULL, T_INT, zero_stage, 0, 3, "N", NULL, 0,
        "ZeRO stage (zero_optimization.stage)"),
    OPT(G_RUN, "strategy", NULL, T_STR, strategy, 0, 0, "ddp|dp|ps", hook_strategy, 0,
        "all-reduce across ranks, threads as devices, parameter server"),
    OPT(G_RUN, "bucket-mb", NULL, T_DBL, bucket_mb, 1e-6, 1e6, "MB", NULL, 0,
        "DDP gradient bucket size in MiB"),
    OPT(G_RUN, "devices", NULL, T_INT, devices, 0, 1024, "N", NULL, 0,
        "dp: worker threads acting as devices; 0 = online cores"),
    OPT(G_RUN, "servers", NULL, T_INT, servers, 1, 65536, "N", NULL, 0,
        "ps: ranks holding parameter shards (the last N ranks)"),
    OPT(G_RUN, "ps-mode", NULL, T_CHOICE, ps_mode, 0, 0, "sync|async", NULL, 0,
        "ps: one update per step from all workers, or one per push"),
    OPT(G_RUN, "staleness", NULL, T_INT, staleness, 0, 1000000, "K", NULL, 0,
        "ps async: steps a worker may run ahead of the slowest"),
    OPT(G_RUN, "compress", NULL, T_STR, compress, 0, 0, "none|topk:R|int8", hook_compress, 0,
        "ps: compress pushes (error feedback)"),
    OPT(G_RUN, "comm-algo", NULL, T_STR, comm_algo, 0, 0, "COLL=ALGO,...", hook_comm_algo, 0,
        "force collective algorithms (default auto: cost model)"),
    OPT(G_CKPT, "eval-every", NULL, T_LONG, eval_every, 0, LMAX, "N", NULL, 0,
        "steps between evaluations; 0 = at the end only"),
    OPT(G_CKPT, "eval-batches", NULL, T_LONG, eval_batches, 0, LMAX, "N", NULL, 0,
        "batches per evaluation; 0 = none"),
    OPT(G_CKPT, "out", NULL, T_STR, out_dir, 0, 0, "DIR", NULL, 0,
        "checkpoint directory (unset: no checkpoints)"),
    OPT(G_CKPT, "save-every", NULL, T_LONG, save_every, 0, LMAX, "N", NULL, 0,
        "steps between checkpoints; 0 = at the end only"),
    OPT(G_CKPT, "keep-last", NULL, T_LONG, keep_last, 1, LMAX, "N", NULL, 0,
        "checkpoints kept in --out"),
    OPT(G_CKPT, "resume", NULL, T_STR, resume, 0, 0, "[=DIR]", hook_resume, O_OPTVAL,
        "resume from DIR; bare: the latest in --out"),
    OPT(G_CKPT, "save-final", NULL, T_STR, save_final, 0, 0, "FILE", NULL, 0,
        "write the final weights (safetensors)"),
    OPT(G_LOG, "print-every", "steps_per_print", T_LONG, print_every, 1, LMAX, "N", NULL, 0,
        "steps between log lines"),
    OPT(G_LOG, "log-ranks", NULL, T_CHOICE, log_ranks, 0, 0, "0|all", NULL, 0,
        "ranks that print (all: each its own lines)"),
    OPT(G_LOG, "log-json", NULL, T_STR, log_json, 0, 0, "FILE", NULL, 0,
        "one JSON object per step (- = stdout)"),
    ACT(G_MISC, "config", "FILE", 0, "JSON config, read before all other flags"),
    ACT(G_MISC, "help", "", O_NOVAL, "print this text (also -h)"),
};

#define NOPTS ((int)(sizeof options / sizeof options[0]))
_Static_assert(sizeof options / sizeof options[0] <= DT_CONFIG_MAX_OPTIONS,
               "raise DT_CONFIG_MAX_OPTIONS in config.h");

/* Index of the option that stores the field at `off`. */
static int opt_at(size_t off)
{
    for (int i = 0; i < NOPTS; i++)
        if (options[i].type != T_ACTION && options[i].off == off) return i;
    return -1;
}
#define IDX(f) opt_at(offsetof(dt_train_config, f))

int dt_config_given_at(const dt_train_config *c, size_t field_offset)
{
    int i = opt_at(field_offset);
    return i >= 0 && c->given[i];
}

static int find_flag(const char *name, size_t len)
{
    for (int i = 0; i < NOPTS; i++)
        if (strlen(options[i].flag) == len && !strncmp(options[i].flag, name, len)) return i;
    return -1;
}

/* The JSON key of an option: its flag with '-' as '_'. */
static int json_key_is(const opt *o, const char *key)
{
    const char *f = o->flag;
    for (; *f && *key; f++, key++)
        if (*key != (*f == '-' ? '_' : *f)) return 0;
    return !*f && !*key;
}

/* *is_alias tells whether the key was DeepSpeed's name. */
static int find_json(const char *key, int *is_alias)
{
    for (int i = 0; i < NOPTS; i++) {
        if (options[i].type == T_ACTION) continue;
        if (json_key_is(&options[i], key)) return *is_alias = 0, i;
        if (options[i].alias && !strcmp(options[i].alias, key)) return *is_alias = 1, i;
    }
    return -1;
}

/* ---- presets and defaults --------------------------------------------- */

typedef struct preset {
    const char *name;
    int n_layer, n_head, n_embd, block_size, vocab_size;
} preset;

static const preset presets[] = {
    {"tiny", 4, 4, 128, 128, 0},           {"gpt2", 12, 12, 768, 1024, 50257},
    {"gpt2-medium", 24, 16, 1024, 1024, 50257}, {"gpt2-large", 36, 20, 1280, 1024, 50257},
    {"gpt2-xl", 48, 25, 1600, 1024, 50257}, {"bench", 6, 6, 384, 256, 256},
};

/* Sets the sizes that were not given explicitly, so that a preset never
 * undoes a size the user asked for, whichever came first. */
static int hook_model(dt_train_config *c, const char *who, char *err, size_t n)
{
    if (!c->model[0]) return 0;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const preset *p = &presets[i];
        if (strcmp(p->name, c->model)) continue;
        if (!c->given[IDX(n_layer)]) c->n_layer = p->n_layer;
        if (!c->given[IDX(n_head)]) c->n_head = p->n_head;
        if (!c->given[IDX(n_embd)]) c->n_embd = p->n_embd;
        if (!c->given[IDX(block_size)]) c->block_size = p->block_size;
        if (!c->given[IDX(vocab_size)]) c->vocab_size = p->vocab_size;
        return 0;
    }
    dt_strf(err, n, "%s: no preset named '%s'", who, c->model);
    return -1;
}

/* --min-lr and --min-lr-ratio say the same thing two ways: the later wins. */
static int hook_min_lr(dt_train_config *c, const char *who, char *err, size_t n)
{
    (void)who, (void)err, (void)n;
    c->given[IDX(min_lr_ratio)] = 0;
    return 0;
}

static int hook_min_lr_ratio(dt_train_config *c, const char *who, char *err, size_t n)
{
    (void)who, (void)err, (void)n;
    c->given[IDX(min_lr)] = 0;
    return 0;
}

static int hook_resume(dt_train_config *c, const char *who, char *err, size_t n)
{
    (void)who, (void)err, (void)n;
    c->resume_flag = 1;
    return 0;
}

/* Refuses a bad --compress when it is given, and keeps it canonical. */
static int hook_compress(dt_train_config *c, const char *who, char *err, size_t n)
{
    dt_compress_spec spec;
    char why[256];
    if (dt_compress_parse(c->compress, &spec, why, sizeof why))
        return dt_strf(err, n, "%s: %s", who, why), -1;
    dt_compress_format(&spec, c->compress, sizeof c->compress);
    return 0;
}

int dt_config_each_comm_algo(const char *spec,
                             int (*apply)(void *ctx, const char *coll, const char *algo,
                                          char *err, size_t n),
                             void *ctx, char *err, size_t n)
{
    char buf[sizeof ((dt_train_config *)0)->comm_algo];
    dt_strf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq || eq == item || !eq[1])
            return dt_strf(err, n, "'%s' is not COLLECTIVE=ALGORITHM (for example allreduce=ring)", item), -1;
        *eq = '\0';
        if (apply(ctx, item, eq + 1, err, n)) return -1;
    }
    return 0;
}

/* Known collective and algorithm names, without a communicator. */
static int check_comm_algo(void *ctx, const char *coll, const char *algo, char *err, size_t n)
{
    (void)ctx;
    const char *names[32];
    int k = dt_comm_algo_names(coll, names, 32);
    if (k < 0)
        return dt_strf(err, n, "'%s' has no choice of algorithms (allreduce, broadcast, allgather, "
                       "reduce_scatter, alltoall do)", coll), -1;
    if (!strcmp(algo, "auto")) return 0;
    char list[256] = "auto";
    for (int i = 0; i < k && i < 32; i++) {
        if (!strcmp(names[i], algo)) return 0;
        dt_strf(list + strlen(list), sizeof list - strlen(list), ", %s", names[i]);
    }
    return dt_strf(err, n, "'%s' is not one of the %s algorithms (choices: %s)", algo, coll, list), -1;
}

/* Any kind the registry knows: the built-in ones, and any a program that
 * links libdtrain registered before parsing (parallel/registry.h). */
static int hook_strategy(dt_train_config *c, const char *who, char *err, size_t n)
{
    if (dt_strategy_find(c->strategy)) return 0;
    char names[256];
    dt_strategy_names(names, sizeof names);
    return dt_strf(err, n, "%s: '%s' is not a strategy (choices: %s)", who, c->strategy, names),
           -1;
}

static int hook_comm_algo(dt_train_config *c, const char *who, char *err, size_t n)
{
    char why[320];
    if (dt_config_each_comm_algo(c->comm_algo, check_comm_algo, NULL, why, sizeof why))
        return dt_strf(err, n, "%s: %s", who, why), -1;
    return 0;
}

void dt_config_defaults(dt_train_config *c)
{
    memset(c, 0, sizeof *c);
    strcpy(c->model, "tiny");
    hook_model(c, "", NULL, 0);
    c->val_fraction = 0.1;
    c->batch_size = 8;
    c->grad_accum = 1;
    c->steps = 200;
    c->lr = 1e-3;
    strcpy(c->lr_schedule, "cosine");
    strcpy(c->optimizer, "adamw");
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    c->weight_decay = 0.01;
    c->grad_clip = 1.0;
    c->seed = 1337;
    c->shuffle = 1;
    strcpy(c->dtype, "fp32");
    strcpy(c->strategy, "ddp");
    c->bucket_mb = 25;
    c->servers = 1;
    strcpy(c->ps_mode, "sync");
    c->staleness = 2;
    strcpy(c->compress, "none");
    c->eval_batches = 8;
    c->keep_last = 3;
    c->print_every = 1;
    strcpy(c->log_ranks, "0");
}

/* ---- values: parsing, range checks, storing --------------------------- */

typedef struct {
    long long i; /* T_INT, T_LONG, T_BOOL */
    unsigned long long u; /* T_U64 */
    double d;    /* T_DBL */
    const char *s; /* T_STR, T_CHOICE */
} opt_val;

/* Integers may be written 1e3 (as DeepSpeed configs often are), but never
 * 1.5: a fraction silently truncated would hide a mistake. */
static int text_to_int(const char *s, long long *out)
{
    return dt_parse_integral(s, LLONG_MIN, LLONG_MAX, out);
}

static int text_to_bool(const char *s, long long *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) return *out = 1, 0;
        if (!strcasecmp(s, no[i])) return *out = 0, 0;
    }
    return -1;
}

static int from_text(const opt *o, const char *who, const char *s, opt_val *v, char *err,
                     size_t n)
{
    char *end;
    switch (o->type) {
    case T_INT:
    case T_LONG:
        if (!text_to_int(s, &v->i)) return 0;
        return dt_strf(err, n, "%s: '%s' is not an integer", who, s), -1;
    case T_U64:
        errno = 0;
        v->u = strtoull(s, &end, 10);
        if (isdigit((unsigned char)*s) && !*end && !errno) return 0;
        return dt_strf(err, n, "%s: '%s' is not a non-negative integer", who, s), -1;
    case T_DBL:
        if (!dt_parse_double(s, -DBL_MAX, DBL_MAX, &v->d)) return 0;
        return dt_strf(err, n, "%s: '%s' is not a number", who, s), -1;
    case T_BOOL:
        if (!text_to_bool(s, &v->i)) return 0;
        return dt_strf(err, n, "%s: '%s' is not a boolean (1|0|true|false)", who, s), -1;
    default:
        v->s = s;
        return 0;
    }
}

static int from_json(const opt *o, const char *who, const cJSON *j, opt_val *v, char *err,
                     size_t n)
{
    static const char *const expected[] = {"an integer", "an integer", "an integer", "a number",
                                           "a boolean", "a string", "a string", ""};
    int ok = 0;
    double d = j->valuedouble;
    if (o->type <= T_U64 && cJSON_IsNumber(j)) {
        /* Integral and exact: cJSON holds every number as a double. */
        if (d != floor(d) || !(fabs(d) <= 9007199254740992.0))
            return dt_strf(err, n, "%s: %g is not an integer", who, d), -1;
        if (o->type == T_U64 && d < 0)
            return dt_strf(err, n, "%s: %g must be >= 0", who, d), -1;
        v->i = (long long)d, v->u = (unsigned long long)(d < 0 ? 0 : d), ok = 1;
    } else if (o->type == T_DBL && cJSON_IsNumber(j)) {
        v->d = d, ok = 1;
    } else if (o->type == T_BOOL &&
               (cJSON_IsBool(j) || (cJSON_IsNumber(j) && (d == 0 || d == 1)))) {
        v->i = cJSON_IsBool(j) ? cJSON_IsTrue(j) : (long long)d, ok = 1;
    } else if (o->type >= T_STR && cJSON_IsString(j)) {
        v->s = j->valuestring, ok = 1;
    } else if ((o->flags & O_OPTVAL) && cJSON_IsTrue(j)) {
        v->s = "", ok = 1;
    }
    if (!ok) dt_strf(err, n, "%s: expected %s%s", who, expected[o->type],
                     (o->flags & O_OPTVAL) ? " or true" : "");
    return ok ? 0 : -1;
}

static void fmt_bound(const opt *o, double b, char *buf, size_t n)
{
    if (o->type == T_DBL) dt_strf(buf, n, "%g", b);
    else dt_strf(buf, n, "%lld", (long long)b);
}

/* "must be >= 1", "must be > 0", "must be in [0, 1)"; a bound that is only
 * the type's limit is shown only when it is the one crossed. */
static int range_error(const opt *o, const char *who, double x, const char *val, char *err,
                       size_t n)
{
    char lo[32], hi[32];
    fmt_bound(o, o->min, lo, sizeof lo);
    fmt_bound(o, o->max, hi, sizeof hi);
    const char *gt = (o->flags & O_MINOPEN) ? ">" : ">=";
    int type_max = isinf(o->max) || o->max == IMAX || o->max == LMAX;
    if (type_max && x > o->max) dt_strf(err, n, "%s: %s must be <= %s", who, val, hi);
    else if (type_max) dt_strf(err, n, "%s: %s must be %s %s", who, val, gt, lo);
    else dt_strf(err, n, "%s: %s must be in %c%s, %s%c", who, val,
                 (o->flags & O_MINOPEN) ? '(' : '[', lo, hi, (o->flags & O_MAXOPEN) ? ')' : ']');
    return -1;
}

static int check_range(const opt *o, const char *who, const opt_val *v, char *err, size_t n)
{
    if (o->type != T_INT && o->type != T_LONG && o->type != T_DBL) return 0;
    double x = o->type == T_DBL ? v->d : (double)v->i;
    char val[40];
    if (o->type == T_DBL) dt_strf(val, sizeof val, "%g", x);
    else dt_strf(val, sizeof val, "%lld", v->i);
    int bad = (o->flags & O_MINOPEN) ? !(x > o->min) : !(x >= o->min);
    bad |= (o->flags & O_MAXOPEN) ? !(x < o->max) : !(x <= o->max);
    return bad ? range_error(o, who, x, val, err, n) : 0;
}

/* The canonical (lower-case) spelling of a choice, or NULL. */
static const char *match_choice(const opt *o, const char *s, char *buf, size_t n)
{
    if (!*s && (o->flags & O_EMPTYOK)) return "";
    for (const char *p = o->meta; *p;) {
        size_t len = strcspn(p, "|");
        if (len && len == strlen(s) && !strncasecmp(p, s, len) && len < n) {
            memcpy(buf, p, len);
            buf[len] = 0;
            return buf;
        }
        p += len + (p[len] == '|');
    }
    return NULL;
}

/* Checks a string value; *s becomes the canonical spelling of a choice. */
static int check_string(const opt *o, const char *who, const char **s, char *buf, size_t bufn,
                        char *err, size_t n)
{
    if (o->type == T_CHOICE) {
        const char *m = match_choice(o, *s, buf, bufn);
        if (!m) return dt_strf(err, n, "%s: unknown value '%s' (one of %s)", who, *s, o->meta), -1;
        *s = m;
    }
    if (strlen(*s) >= o->size)
        return dt_strf(err, n, "%s: value longer than %zu characters", who, o->size - 1), -1;
    return 0;
}

static int store(dt_train_config *c, int idx, opt_val v, const char *who, char *err, size_t n)
{
    const opt *o = &options[idx];
    char *p = (char *)c + o->off, canon[64];
    if (check_range(o, who, &v, err, n) ||
        (o->type >= T_STR && check_string(o, who, &v.s, canon, sizeof canon, err, n)))
        return -1;
    switch (o->type) {
    case T_INT:
    case T_BOOL: *(int *)p = (int)v.i; break;
    case T_LONG: *(long *)p = (long)v.i; break;
    case T_U64: *(unsigned long long *)p = v.u; break;
    case T_DBL: *(double *)p = v.d; break;
    default: memmove(p, v.s, strlen(v.s) + 1); break;
    }
    c->given[idx] = 1;
    return o->hook ? o->hook(c, who, err, n) : 0;
}

static int set_text(dt_train_config *c, int idx, const char *who, const char *s, char *err,
                    size_t n)
{
    opt_val v = {0};
    return from_text(&options[idx], who, s, &v, err, n) ? -1 : store(c, idx, v, who, err, n);
}

/* who for a JSON key: "FILE: key". */
static void json_who(char *who, size_t n, const char *path, const char *key)
{
    dt_strf(who, n, "%s: %s", path, key);
}

static int set_json(dt_train_config *c, int idx, const char *path, const char *key,
                    const cJSON *j, char *err, size_t n)
{
    char who[DT_CONFIG_PATH + 128];
    json_who(who, sizeof who, path, key);
    if ((options[idx].flags & O_OPTVAL) && cJSON_IsFalse(j)) {
        c->resume_flag = 0, c->resume[0] = 0;
        return 0;
    }
    opt_val v = {0};
    return from_json(&options[idx], who, j, &v, err, n) ? -1 : store(c, idx, v, who, err, n);
}

/* ---- JSON: DeepSpeed sections ----------------------------------------- */

static void warn_unknown(const char *path, const char *prefix, const char *key)
{
    DT_WARN("%s: unknown key '%s%s' (ignored)", path, prefix, key);
}

static int want_object(const cJSON *j, const char *path, const char *key, char *err, size_t n)
{
    if (cJSON_IsObject(j)) return 0;
    dt_strf(err, n, "%s: %s: expected an object", path, key);
    return -1;
}

static int want_string(const cJSON *j, const char *path, const char *key, char *err, size_t n)
{
    if (cJSON_IsString(j)) return 0;
    dt_strf(err, n, "%s: %s: expected a string", path, key);
    return -1;
}

static int set_betas(dt_train_config *c, const char *path, const cJSON *j, char *err, size_t n)
{
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != 2) {
        dt_strf(err, n, "%s: optimizer.params.betas: expected an array of 2 numbers", path);
        return -1;
    }
    return set_json(c, IDX(beta1), path, "optimizer.params.betas[0]", cJSON_GetArrayItem(j, 0),
                    err, n) ||
                   set_json(c, IDX(beta2), path, "optimizer.params.betas[1]",
                            cJSON_GetArrayItem(j, 1), err, n)
               ? -1
               : 0;
}

static int optimizer_params(dt_train_config *c, const char *path, const cJSON *params,
                            char *err, size_t n)
{
    static const struct { const char *key; size_t off; } map[] = {
        {"lr", offsetof(dt_train_config, lr)},
        {"eps", offsetof(dt_train_config, eps)},
        {"weight_decay", offsetof(dt_train_config, weight_decay)},
        {"momentum", offsetof(dt_train_config, momentum)},
    };
    const cJSON *it;
    cJSON_ArrayForEach(it, params) {
        char key[128];
        dt_strf(key, sizeof key, "optimizer.params.%s", it->string);
        size_t i = 0;
        while (i < sizeof map / sizeof map[0] && strcmp(map[i].key, it->string)) i++;
        if (i < sizeof map / sizeof map[0]) {
            if (set_json(c, opt_at(map[i].off), path, key, it, err, n)) return -1;
        } else if (!strcmp(it->string, "betas")) {
            if (set_betas(c, path, it, err, n)) return -1;
        } else if (!strcmp(it->string, "adam_w_mode")) {
            if (!cJSON_IsBool(it))
                return dt_strf(err, n, "%s: %s: expected a boolean", path, key), -1;
        } else if (strcmp(it->string, "torch_adam")) {
            warn_unknown(path, "optimizer.params.", it->string);
        }
    }
    return 0;
}

/* A DeepSpeed section {"type": "...", "params": {...}}: its type and its
 * params (NULL when absent); other keys are warned about. */
static int typed_section(const char *path, const char *section, const cJSON *j,
                         const char **type, const cJSON **params, char *err, size_t n)
{
    char key[64];
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    *params = cJSON_GetObjectItemCaseSensitive(j, "params");
    if (!t) return dt_strf(err, n, "%s: %s: missing \"type\"", path, section), -1;
    dt_strf(key, sizeof key, "%s.type", section);
    if (want_string(t, path, key, err, n)) return -1;
    dt_strf(key, sizeof key, "%s.params", section);
    if (*params && want_object(*params, path, key, err, n)) return -1;
    *type = t->valuestring;
    dt_strf(key, sizeof key, "%s.", section);
    const cJSON *it;
    cJSON_ArrayForEach(it, j)
        if (strcmp(it->string, "type") && strcmp(it->string, "params"))
            warn_unknown(path, key, it->string);
    return 0;
}

/* A value a DeepSpeed key maps to, stored as if given under that key. */
static int store_json_text(dt_train_config *c, int idx, const char *path, const char *key,
                           const char *value, char *err, size_t n)
{
    char who[DT_CONFIG_PATH + 128];
    json_who(who, sizeof who, path, key);
    return store(c, idx, (opt_val){.s = value}, who, err, n);
}

static int ds_optimizer(dt_train_config *c, const char *path, const cJSON *j, char *err,
                        size_t n)
{
    const char *t;
    const cJSON *params;
    if (typed_section(path, "optimizer", j, &t, &params, err, n)) return -1;
    const char *mapped = NULL;
    const cJSON *wmode = params ? cJSON_GetObjectItemCaseSensitive(params, "adam_w_mode") : NULL;
    if (!strcasecmp(t, "adamw")) mapped = "adamw";
    else if (!strcasecmp(t, "adam")) mapped = cJSON_IsFalse(wmode) ? "adam" : "adamw";
    else if (!strcasecmp(t, "sgd")) mapped = "sgd";
    if (!mapped)
        return dt_strf(err, n, "%s: optimizer.type: unsupported optimizer '%s' (AdamW, Adam, SGD)",
                       path, t), -1;
    if (store_json_text(c, IDX(optimizer), path, "optimizer.type", mapped, err, n)) return -1;
    return params ? optimizer_params(c, path, params, err, n) : 0;
}

/* One scheduler parameter onto its field; 1 when the key is not one of them. */
static int scheduler_param(dt_train_config *c, const char *path, const cJSON *it, char *err,
                           size_t n)
{
    static const struct { const char *key; size_t off; } map[] = {
        {"warmup_max_lr", offsetof(dt_train_config, lr)},
        {"warmup_min_lr", offsetof(dt_train_config, min_lr)},
        {"warmup_num_steps", offsetof(dt_train_config, warmup_steps)},
        {"total_num_steps", offsetof(dt_train_config, steps)},
        {"cos_min_ratio", offsetof(dt_train_config, min_lr_ratio)},
    };
    char key[128];
    dt_strf(key, sizeof key, "scheduler.params.%s", it->string);
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i].key, it->string)) return set_json(c, opt_at(map[i].off), path, key,
                                                              it, err, n);
    if (!strcmp(it->string, "warmup_type")) return want_string(it, path, key, err, n);
    /* Accepted, not mapped: dtrain's warmup starts at 0; the step counter
     * comes from the checkpoint. */
    if (!strcmp(it->string, "warmup_min_ratio") || !strcmp(it->string, "last_batch_iteration"))
        return 0;
    return 1;
}

static int scheduler_params(dt_train_config *c, const char *path, const cJSON *params,
                            char *err, size_t n)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, params) {
        int rc = scheduler_param(c, path, it, err, n);
        if (rc < 0) return -1;
        if (rc > 0) warn_unknown(path, "scheduler.params.", it->string);
    }
    const cJSON *wn = cJSON_GetObjectItemCaseSensitive(params, "warmup_num_steps");
    const cJSON *wt = cJSON_GetObjectItemCaseSensitive(params, "warmup_type");
    if (cJSON_IsNumber(wn) && wn->valuedouble > 0 &&
        !(cJSON_IsString(wt) && !strcmp(wt->valuestring, "linear")))
        DT_WARN("%s: scheduler.params.warmup_type is %s; dtrain warms up linearly", path,
                cJSON_IsString(wt) ? wt->valuestring : "unset (DeepSpeed's default: log)");
    return 0;
}

static int ds_scheduler(dt_train_config *c, const char *path, const cJSON *j, char *err,
                        size_t n)
{
    static const char *const types[][2] = {
        {"WarmupLR", "constant"}, {"WarmupDecayLR", "linear"}, {"WarmupCosineLR", "cosine"}};
    const char *t;
    const cJSON *params;
    if (typed_section(path, "scheduler", j, &t, &params, err, n)) return -1;
    const char *mapped = NULL;
    for (int i = 0; i < 3; i++)
        if (!strcasecmp(t, types[i][0])) mapped = types[i][1];
    if (!mapped)
        return dt_strf(err, n, "%s: scheduler.type: unsupported scheduler '%s' (WarmupLR, "
                       "WarmupDecayLR, WarmupCosineLR)", path, t), -1;
    if (store_json_text(c, IDX(lr_schedule), path, "scheduler.type", mapped, err, n)) return -1;
    return params ? scheduler_params(c, path, params, err, n) : 0;
}

/* {"enabled": bool}; returns the flag in *on (-1 when absent). */
static int enabled_of(const cJSON *j, const char *path, const char *key, int *on, char *err,
                      size_t n)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "enabled");
    *on = -1;
    if (!e) return 0;
    if (!cJSON_IsBool(e))
        return dt_strf(err, n, "%s: %s.enabled: expected a boolean", path, key), -1;
    *on = cJSON_IsTrue(e);
    return 0;
}

static int ds_bf16(dt_train_config *c, const char *path, const cJSON *j, char *err, size_t n)
{
    int on;
    if (enabled_of(j, path, "bf16", &on, err, n)) return -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, j)
        if (strcmp(it->string, "enabled")) warn_unknown(path, "bf16.", it->string);
    if (on >= 0) strcpy(c->dtype, on ? "bf16" : "fp32");
    return 0;
}

/* Its other keys (loss_scale, ...) only matter when enabled. */
static int ds_fp16(dt_train_config *c, const char *path, const cJSON *j, char *err, size_t n)
{
    (void)c;
    int on;
    if (enabled_of(j, path, "fp16", &on, err, n)) return -1;
    if (on <= 0) return 0;
    dt_strf(err, n, "%s: fp16.enabled: fp16 with loss scaling is not supported yet; use "
            "\"bf16\": {\"enabled\": true} (or --dtype bf16)", path);
    return -1;
}

/* stage, and reduce_bucket_size (in elements, DeepSpeed's unit) as the
 * bucket of the gradient reduction; the other keys belong to the ZeRO
 * strategies to come. */
static int ds_zero(dt_train_config *c, const char *path, const cJSON *j, char *err, size_t n)
{
    const cJSON *stage = cJSON_GetObjectItemCaseSensitive(j, "stage");
    if (stage && set_json(c, IDX(zero_stage), path, "zero_optimization.stage", stage, err, n))
        return -1;
    const cJSON *bucket = cJSON_GetObjectItemCaseSensitive(j, "reduce_bucket_size");
    if (!bucket) return 0;
    if (!cJSON_IsNumber(bucket) || !(bucket->valuedouble >= 1))
        return dt_strf(err, n, "%s: zero_optimization.reduce_bucket_size: want a number of "
                       "elements >= 1", path), -1;
    char who[DT_CONFIG_PATH + 128];
    json_who(who, sizeof who, path, "zero_optimization.reduce_bucket_size");
    opt_val v = {.d = bucket->valuedouble * sizeof(float) / 1048576.0};
    return store(c, IDX(bucket_mb), v, who, err, n);
}

static int ds_accept(dt_train_config *c, const char *path, const cJSON *j, char *err, size_t n)
{
    (void)c, (void)path, (void)j, (void)err, (void)n;
    return 0;
}

static int ds_unsupported(dt_train_config *c, const char *path, const cJSON *j, char *err,
                          size_t n)
{
    (void)c, (void)err, (void)n;
    DT_WARN("%s: %s is not supported yet (ignored)", path, j->string);
    return 0;
}

typedef struct ds_section {
    const char *key;
    int object; /* the value must be an object */
    int pass;   /* 0: before the other DeepSpeed keys */
    int (*fn)(dt_train_config *c, const char *path, const cJSON *j, char *err, size_t n);
} ds_section;

static const ds_section sections[] = {
    {"optimizer", 1, 0, ds_optimizer},
    {"scheduler", 1, 1, ds_scheduler},
    {"bf16", 1, 1, ds_bf16},
    {"fp16", 1, 1, ds_fp16},
    {"zero_optimization", 1, 1, ds_zero},
    {"wall_clock_breakdown", 0, 1, ds_accept},
    {"activation_checkpointing", 0, 1, ds_unsupported},
};

/* ---- JSON: the file --------------------------------------------------- */

/* Which pass applies a top-level item: 0 DeepSpeed's optimizer section,
 * 1 DeepSpeed's other keys, 2 dtrain's own keys (and unknown-key warnings).
 * "optimizer" is DeepSpeed's section when an object, dtrain's otherwise. */
static int json_item(dt_train_config *c, const char *path, const cJSON *it, int pass, char *err,
                     size_t n)
{
    const char *k = it->string;
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
        const ds_section *s = &sections[i];
        if (strcmp(s->key, k) || (!strcmp(k, "optimizer") && !cJSON_IsObject(it))) continue;
        if (pass != s->pass) return 0;
        if (s->object && want_object(it, path, k, err, n)) return -1;
        return s->fn(c, path, it, err, n);
    }
    int alias, idx = find_json(k, &alias);
    if (idx < 0) {
        if (pass == 2) warn_unknown(path, "", k);
        return 0;
    }
    return pass == (alias ? 1 : 2) ? set_json(c, idx, path, k, it, err, n) : 0;
}

static void parse_error(const char *path, const char *text, const char *at, char *err, size_t n)
{
    int line = 1, col = 1;
    for (const char *p = text; at && p < at; p++) {
        if (*p == '\n') line++, col = 1;
        else col++;
    }
    dt_strf(err, n, "%s:%d:%d: invalid JSON", path, line, col);
}

int dt_config_load_json(dt_train_config *c, const char *path, char *err, size_t errlen)
{
    size_t len;
    char *text = dt_read_file(path, (size_t)64 << 20, &len, err, errlen);
    if (!text) return -1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    int rc = 0;
    if (!root) {
        parse_error(path, text, end, err, errlen);
        rc = -1;
    } else if (!cJSON_IsObject(root)) {
        dt_strf(err, errlen, "%s: the top level must be a JSON object", path);
        rc = -1;
    }
    for (int pass = 0; pass < 3 && !rc; pass++) {
        const cJSON *it;
        cJSON_ArrayForEach(it, root)
            if ((rc = json_item(c, path, it, pass, err, errlen))) break;
    }
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* ---- flags ------------------------------------------------------------ */

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
    for (int i = 0; i < NOPTS; i++) {
        int d = edit_distance(name, len, options[i].flag);
        if (d < bestd) best = i, bestd = d;
    }
    if (best >= 0)
        dt_strf(err, n, "unknown option '--%.*s' (did you mean --%s? see --help)", (int)len, name,
                options[best].flag);
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
        return dt_strf(err, n, "unexpected argument '%s' (options start with --; see --help)", a),
               -1;
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    if ((*idx = find_flag(name, len)) < 0) return unknown_flag(name, len, err, n);
    const opt *o = &options[*idx];
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
        const opt *o = &options[idx];
        int is_config = !strcmp(o->flag, "config");
        if (phase == 0 && is_config && dt_config_load_json(c, val, err, n)) return -1;
        if (phase == 1 && o->type != T_ACTION) {
            char who[64];
            dt_strf(who, sizeof who, "--%s", o->flag);
            if (set_text(c, idx, who, val ? val : "", err, n)) return -1;
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

/* ---- validation ------------------------------------------------------- */

static opt_val read_field(const dt_train_config *c, const opt *o)
{
    const char *p = (const char *)c + o->off;
    opt_val v = {0};
    switch (o->type) {
    case T_INT:
    case T_BOOL: v.i = *(const int *)p; break;
    case T_LONG: v.i = *(const long *)p; break;
    case T_U64: v.u = *(const unsigned long long *)p; break;
    case T_DBL: v.d = *(const double *)p; break;
    case T_ACTION: break;
    default: v.s = p; break;
    }
    return v;
}

/* Every field against the table's range and choices, named by its JSON key. */
static int check_fields(dt_train_config *c, char *err, size_t n)
{
    for (int i = 0; i < NOPTS; i++) {
        const opt *o = &options[i];
        if (o->type == T_ACTION) continue;
        char who[40], canon[64];
        dt_strf(who, sizeof who, "%s", o->flag);
        for (char *p = who; *p; p++) *p = *p == '-' ? '_' : *p;
        opt_val v = read_field(c, o);
        if (check_range(o, who, &v, err, n)) return -1;
        if (o->type == T_CHOICE && check_string(o, who, &v.s, canon, sizeof canon, err, n))
            return -1;
        if (o->type == T_CHOICE) memmove((char *)c + o->off, v.s, strlen(v.s) + 1);
        if (o->type == T_BOOL && v.i != 0 && v.i != 1)
            return dt_strf(err, n, "%s: %lld must be 0 or 1", who, v.i), -1;
    }
    return 0;
}

static int check_model(dt_train_config *c, char *err, size_t n)
{
    if (c->n_embd % c->n_head)
        return dt_strf(err, n, "n_embd = %d is not divisible by n_head = %d", c->n_embd,
                       c->n_head), -1;
    if (!c->seq_len) c->seq_len = c->block_size;
    if (c->seq_len > c->block_size)
        return dt_strf(err, n, "seq_len = %d exceeds block_size = %d", c->seq_len,
                       c->block_size), -1;
    return 0;
}

static int check_optim(dt_train_config *c, char *err, size_t n)
{
    if (c->given[IDX(min_lr_ratio)]) c->min_lr = c->min_lr_ratio * c->lr;
    if (c->min_lr > c->lr)
        return dt_strf(err, n, "min_lr = %g exceeds lr = %g", c->min_lr, c->lr), -1;
    if (c->warmup_steps > c->steps)
        return dt_strf(err, n, "warmup_steps = %ld exceeds steps = %ld (lower --warmup-steps)",
                       c->warmup_steps, c->steps), -1;
    return 0;
}

/* DeepSpeed's rule: train_batch_size = micro x accum x dp. The number that
 * was not given is inferred; with only train_batch_size given, the
 * micro-batch (which sets the memory) is held and accum inferred. */
static int check_batch(dt_train_config *c, int dp, char *err, size_t n)
{
    long long micro = c->batch_size, accum = c->grad_accum;
    if ((double)micro * (double)accum * dp > LMAX)
        return dt_strf(err, n, "batch_size %lld x grad_accum %lld x data-parallel size %d is "
                       "too large", micro, accum, dp), -1;
    long long per_step = micro * accum * dp;
    int micro_given = c->given[IDX(batch_size)], accum_given = c->given[IDX(grad_accum)];
    if (!c->given[IDX(train_batch_size)] || c->train_batch_size == 0) {
        c->train_batch_size = (long)per_step;
        return 0;
    }
    long long tb = c->train_batch_size;
    if (micro_given && accum_given) {
        if (tb == per_step) return 0;
        return dt_strf(err, n, "train_batch_size %lld does not equal "
                       "train_micro_batch_size_per_gpu (--batch-size) %lld x "
                       "gradient_accumulation_steps (--grad-accum) %lld x "
                       "data-parallel size %d = %lld", tb, micro, accum, dp, per_step), -1;
    }
    int infer_micro = accum_given; /* else hold the micro-batch, infer accum */
    long long held = infer_micro ? accum : micro, d = held * dp;
    const char *held_name = infer_micro ? "gradient_accumulation_steps" :
                                          "train_micro_batch_size_per_gpu";
    const char *inferred = infer_micro ? "train_micro_batch_size_per_gpu" :
                                         "gradient_accumulation_steps";
    if (tb % d || tb / d > INT_MAX)
        return dt_strf(err, n, "train_batch_size %lld is not a multiple of %s %lld x "
                       "data-parallel size %d = %lld (cannot infer %s)", tb, held_name, held,
                       dp, d, inferred), -1;
    if (infer_micro) c->batch_size = (int)(tb / d);
    else c->grad_accum = (int)(tb / d);
    return 0;
}

static int check_run(const dt_train_config *c, char *err, size_t n)
{
    if (c->resume_flag && !c->resume[0] && !c->out_dir[0])
        return dt_strf(err, n, "resume: --resume without a directory needs --out "
                       "(or give --resume=DIR)"), -1;
    if (c->save_every > 0 && !c->out_dir[0])
        return dt_strf(err, n, "save_every = %ld needs --out DIR", c->save_every), -1;
    return 0;
}

int dt_config_validate(dt_train_config *c, int data_parallel_size, char *err, size_t errlen)
{
    if (data_parallel_size < 1)
        return dt_strf(err, errlen, "data-parallel size %d must be >= 1", data_parallel_size), -1;
    if (check_fields(c, err, errlen) || check_model(c, err, errlen) ||
        check_optim(c, err, errlen) || check_batch(c, data_parallel_size, err, errlen) ||
        check_run(c, err, errlen))
        return -1;
    return 0;
}

int dt_config_data_parallel_size(const dt_train_config *c, int world, int *dp_size, char *err,
                                 size_t n)
{
    int dp = !strcmp(c->strategy, "dp"), ps = !strcmp(c->strategy, "ps");
    static const struct { size_t off; int strategy; } owned[] = {
        {offsetof(dt_train_config, devices), 1},   {offsetof(dt_train_config, servers), 2},
        {offsetof(dt_train_config, ps_mode), 2},   {offsetof(dt_train_config, staleness), 2},
        {offsetof(dt_train_config, compress), 2},
    };
    static const char *const names[] = {"ddp", "dp", "ps"};
    int mine = dp ? 1 : ps ? 2 : 0;
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) {
        int idx = opt_at(owned[i].off);
        if (c->given[idx] && owned[i].strategy != mine)
            return dt_strf(err, n, "--%s applies to --strategy %s, not %s", options[idx].flag,
                           names[owned[i].strategy], c->strategy), -1;
    }
    if (dp) {
        if (world > 1)
            return dt_strf(err, n, "--strategy dp runs in one process (its devices are threads); "
                           "this job has %d ranks: use --strategy ddp across processes", world),
                   -1;
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        *dp_size = c->devices > 0 ? c->devices : (int)(cores > 0 ? cores : 1);
        return 0;
    }
    if (ps) {
        if (world <= c->servers)
            return dt_strf(err, n, "--strategy ps with %d server%s needs at least %d ranks "
                           "(servers + workers); this job has %d: start it with --nproc",
                           c->servers, c->servers > 1 ? "s" : "", c->servers + 1, world), -1;
        if (c->given[IDX(staleness)] && strcmp(c->ps_mode, "async"))
            return dt_strf(err, n, "--staleness applies to --ps-mode async"), -1;
        *dp_size = world - c->servers;
        return 0;
    }
    *dp_size = world;
    return 0;
}

/* ---- schedule --------------------------------------------------------- */

double dt_config_lr_at(const dt_train_config *c, long step)
{
    long w = c->warmup_steps > 0 ? c->warmup_steps : 0;
    if (step < 0) step = 0;
    if (step < w) return c->lr * (double)(step + 1) / (double)w;
    double p = c->steps > w ? (double)(step - w) / (double)(c->steps - w) : 1.0;
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    if (!strcmp(c->lr_schedule, "cosine"))
        return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(M_PI * p));
    if (!strcmp(c->lr_schedule, "linear")) return c->min_lr + (c->lr - c->min_lr) * (1.0 - p);
    return c->lr;
}

/* ---- printing --------------------------------------------------------- */

static const char *or_dash(const char *s) { return *s ? s : "-"; }

void dt_config_print(const dt_train_config *c, FILE *f)
{
    char vocab[32], val[DT_CONFIG_PATH + 32];
    if (c->vocab_size) dt_strf(vocab, sizeof vocab, "%d", c->vocab_size);
    else dt_strf(vocab, sizeof vocab, "from data");
    if (c->val_data[0]) dt_strf(val, sizeof val, "%s", c->val_data);
    else dt_strf(val, sizeof val, "last %g of data", c->val_fraction);
    fprintf(f, "model  %s: n_layer %d, n_head %d, n_embd %d, block_size %d, vocab %s\n",
            or_dash(c->model), c->n_layer, c->n_head, c->n_embd, c->block_size, vocab);
    fprintf(f, "data   %s (val: %s), init %s, shuffle %s\n", or_dash(c->data), val,
            or_dash(c->init), c->shuffle ? "on" : "off");
    fprintf(f, "batch  %d seq x %d tokens x %d accum per rank, %ld seq per step\n", c->batch_size,
            c->seq_len ? c->seq_len : c->block_size, c->grad_accum, c->train_batch_size);
    char moments[96];
    if (strcmp(c->optimizer, "sgd"))
        dt_strf(moments, sizeof moments, "betas %g %g, eps %g", c->beta1, c->beta2, c->eps);
    else
        dt_strf(moments, sizeof moments, "momentum %g", c->momentum);
    fprintf(f, "optim  %s lr %g -> %g (%s, warmup %ld), %s, wd %g, clip %g\n", c->optimizer,
            c->lr, c->min_lr, c->lr_schedule, c->warmup_steps, moments, c->weight_decay,
            c->grad_clip);
    fprintf(f, "run    %ld steps, %s, seed %llu, threads %d, zero stage %d, print every %ld\n",
            c->steps, c->dtype, c->seed, c->threads, c->zero_stage, c->print_every);
    fprintf(f, "eval   every %ld steps (0 = end), %ld batches; out %s, save every %ld, "
            "keep %ld%s%s\n", c->eval_every, c->eval_batches, or_dash(c->out_dir),
            c->save_every, c->keep_last, c->resume_flag ? ", resume " : "",
            c->resume_flag ? or_dash(c->resume) : "");
}

static void fmt_default(const dt_train_config *d, const opt *o, char *buf, size_t n)
{
    opt_val v = read_field(d, o);
    buf[0] = 0;
    switch (o->type) {
    case T_INT:
    case T_LONG:
    case T_BOOL: dt_strf(buf, n, "%lld", v.i); break;
    case T_U64: dt_strf(buf, n, "%llu", v.u); break;
    case T_DBL: dt_strf(buf, n, "%g", v.d); break;
    case T_STR:
    case T_CHOICE: dt_strf(buf, n, "%s", v.s); break;
    default: break;
    }
}

static void usage_option(FILE *f, const dt_train_config *d, const opt *o)
{
    char left[96], def[64];
    int eq = (o->flags & O_OPTVAL) != 0;
    dt_strf(left, sizeof left, "  --%s%s%s", o->flag, eq || !*o->meta ? "" : " ", o->meta);
    fmt_default(d, o, def, sizeof def);
    if (strlen(left) > 29) fprintf(f, "%s\n%-30s", left, "");
    else fprintf(f, "%-30s", left);
    fprintf(f, "%s%s%s%s\n", o->help, *def ? " [" : "", def, *def ? "]" : "");
}

void dt_config_usage(FILE *f)
{
    dt_train_config d;
    dt_config_defaults(&d);
    fprintf(f, "Training options, as --name VALUE or --name=VALUE; defaults in [].\n"
               "A JSON file given with --config is read first and flags override it.\n");
    for (int g = 0; g < G_COUNT; g++) {
        fprintf(f, "\n%s:\n", group_titles[g]);
        for (int i = 0; i < NOPTS; i++)
            if (options[i].group == g) usage_option(f, &d, &options[i]);
    }
    fprintf(f, "\nJSON keys are the option names in snake_case (\"n_layer\": 12) and DeepSpeed's:\n"
               "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps\n"
               "(train_batch_size = micro x accum x ranks; the missing one is inferred),\n"
               "gradient_clipping, steps_per_print, optimizer {type AdamW|Adam|SGD, params},\n"
               "scheduler {type WarmupLR|WarmupDecayLR|WarmupCosineLR, params}, bf16 {enabled},\n"
               "zero_optimization {stage}. Integers may be written 1e3. Unknown keys warn.\n"
               "Schedule: linear warmup to --lr over --warmup-steps, then constant, cosine or\n"
               "linear decay to --min-lr at --steps.\n");
}
