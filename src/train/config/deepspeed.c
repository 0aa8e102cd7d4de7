/* DeepSpeed's keys in a --config file, and what each means in dtrain.
 *
 * Every DeepSpeed key dtrain knows is a row of a table below, and does one
 * of three things:
 *   OPTION  sets a dtrain option (optimizer.params.lr -> --lr);
 *   OWN     has its own function (a ZeRO stage, betas, the bucket size);
 *   NOOP    has no counterpart in dtrain, so it is accepted only with the
 *           value that changes nothing (wall_clock_breakdown false) and
 *           refused otherwise, with a message that says it is not
 *           supported yet and what to write instead.
 * A key that no row names prints a warning with its name (another
 * version's key, or a typo), except in zero_optimization: every key there
 * but stage, reduce_bucket_size and overlap_comm configures ZeRO stages
 * 1-3, which dtrain does not have yet, so it is refused.
 *
 * The mapping:
 *   train_batch_size, train_micro_batch_size_per_gpu (--batch-size),
 *   gradient_accumulation_steps (--grad-accum): see dt_config_validate.
 *   gradient_clipping -> grad_clip; steps_per_print -> print_every.
 *   optimizer.type AdamW -> adamw; Adam -> adamw, because DeepSpeed's Adam
 *     decouples weight decay unless params.adam_w_mode is false (then adam,
 *     L2 decay); SGD -> sgd. params: lr, betas [b1, b2], eps, weight_decay
 *     (all types), betas and eps (Adam, AdamW), momentum (SGD),
 *     adam_w_mode (Adam), torch_adam (Adam, AdamW; PyTorch's implementation
 *     of the same formula, which is dtrain's: accepted either way).
 *   scheduler.type WarmupLR -> constant, WarmupDecayLR -> linear (decays to
 *     warmup_min_lr at total_num_steps, as DeepSpeed does), WarmupCosineLR ->
 *     cosine. params: warmup_max_lr -> lr, warmup_min_lr -> min_lr,
 *     warmup_num_steps -> warmup_steps, total_num_steps -> steps,
 *     cos_min_ratio -> min_lr_ratio. Params that are absent keep dtrain's
 *     values (not DeepSpeed's defaults). dtrain warms up linearly from 0:
 *     warmup_type "log", warmup_min_ratio above 0, and WarmupLR's
 *     warmup_min_lr (where it is only the warmup's start) are refused; a
 *     file that leaves warmup_type out (DeepSpeed's default is log) warns.
 *   communication_data_type -> comm_dtype ("fp32" or "bf16": how gradients
 *     are reduced); data_types.grad_accum_dtype -> grad_accum_dtype.
 *   bf16.enabled -> dtype bf16 (false -> fp32). fp16.enabled true is
 *     refused (no loss scaling yet); with fp16 off its other keys change
 *     nothing and are accepted.
 *   zero_optimization.stage -> zero_stage (dt_cfg_check_zero);
 *     zero_quantized_weights -> zero_qwz (qwZ);
 *     zero_hpz_partition_size -> zero_hpz (hpZ);
 *     offload_optimizer {device none|cpu|nvme, nvme_path, buffer_count} ->
 *     offload_optimizer, nvme_path, offload_buffers (pin_memory, fast_init
 *     accepted); offload_param {device, nvme_path} -> offload_param,
 *     nvme_path (the same as offload_optimizer's, or refused: one file
 *     holds both; pin_memory accepted; its swap-buffer keys refused);
 *     sub_group_size -> sub_group_size (the offload stream's chunk);
 *     aio.block_size, aio.queue_depth -> aio_block_size,
 *     aio_queue_depth (single_submit false, overlap_events true,
 *     thread_count 1 accepted);
 *   pipeline.stages -> pp; pipeline.partition "uniform" | "parameters" ->
 *     pp_partition uniform | params; tensor_parallel.autotp_size -> tp;
 *     sequence_parallel_size (DeepSpeed-Ulysses) -> cp with cp_algo ulysses;
 *     stage3_prefetch_bucket_size, stage3_max_live_parameters and
 *     stage3_param_persistence_threshold (elements) -> zero_prefetch_elems,
 *     zero_max_live, zero_persist; reduce_bucket_size (in elements, DeepSpeed's
 *     unit) -> bucket_mb; overlap_comm true is what DDP always does.
 *   activation_checkpointing: the section turns on --recompute full. In
 *     DeepSpeed the model's code chooses what to checkpoint and the section
 *     tunes it; a model that checkpoints each transformer layer keeps only
 *     the layer's input and re-runs its forward in backward, which is
 *     dtrain's full mode (dtrain's own "recompute" key, or the flag, wins:
 *     "recompute": "selective" beside the section gives selective). Its keys:
 *     partition_activations (split across model-parallel ranks: dtrain has
 *     no model parallelism), cpu_checkpointing and
 *     contiguous_memory_optimization (both act on partitioned checkpoints;
 *     dtrain's activations are in host memory already, in one arena),
 *     number_checkpoints (sizes that contiguous buffer) and profile are
 *     accepted off and refused on; synchronize_checkpoint_boundary is
 *     accepted either way: dtrain's kernels are synchronous, so every
 *     boundary is synchronized already.
 *   wall_clock_breakdown: false only. */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/log.h"
#include "core/str.h"
#include "train/config/internal.h"

typedef struct ds_ctx {
    dt_cfg_file *f; /* the keys that have set options */
    dt_train_config *c;
    const char *path;
    const char *type; /* a typed section's "type", as written */
    char *err;
    size_t n;
} ds_ctx;

typedef struct ds_key ds_key;
typedef int (*ds_fn)(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j);

typedef enum { K_OPTION, K_NOOP, K_OWN } ds_kind;

struct ds_key {
    const char *name;
    ds_kind kind;
    size_t off;       /* K_OPTION (and K_OWN where it sets one): the option's field */
    ds_fn fn;         /* K_OWN */
    const char *noop; /* K_NOOP: the value that changes nothing: false, true, off
                         (false, null or 0), a number or a "string" */
    const char *why;  /* K_NOOP: what is not supported, and what to write instead */
    const char *only; /* the section types it belongs to ("Adam|AdamW"); NULL: all */
};

#define OPTION(name, field, only) \
    {name, K_OPTION, offsetof(dt_train_config, field), NULL, NULL, NULL, only}
#define OWN(name, field, fn, only) \
    {name, K_OWN, offsetof(dt_train_config, field), fn, NULL, NULL, only}
#define NOOP(name, value, why) {name, K_NOOP, 0, NULL, value, why, NULL}

typedef struct ds_section {
    const char *name;
    int pass;  /* 0: before the other DeepSpeed keys (the optimizer) */
    int typed; /* {"type": ..., "params": {...}}: the rows are the params */
    const ds_key *keys;
    size_t nkeys;
    int (*begin)(ds_ctx *x, const cJSON *keys); /* before the keys; may be NULL */
    int (*end)(ds_ctx *x, const cJSON *keys);   /* after them; may be NULL */
    ds_fn other; /* a key no row names; NULL: a warning */
} ds_section;

/* "FILE: key: what" into x->err; returns -1. */
__attribute__((format(printf, 3, 4))) static int fail(ds_ctx *x, const char *key,
                                                      const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    dt_strf(x->err, x->n, "%s: %s: %s", x->path, key, what);
    return -1;
}

static void warn_unknown(const ds_ctx *x, const char *key)
{
    DT_WARN("%s: unknown key '%s' (ignored)", x->path, key);
}

/* Whether `name` is one of "A|B|C" (case-insensitive, as DeepSpeed's types). */
static int in_list(const char *list, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, "|");
        if (l == len && !strncasecmp(p, name, len)) return 1;
        p += l + (p[l] == '|');
    }
    return 0;
}

/* ---- NOOP keys ------------------------------------------------------------ */

static int value_is(const cJSON *j, const char *noop)
{
    if (!strcmp(noop, "false")) return cJSON_IsFalse(j);
    if (!strcmp(noop, "true")) return cJSON_IsTrue(j);
    if (!strcmp(noop, "off"))
        return cJSON_IsFalse(j) || cJSON_IsNull(j) || (cJSON_IsNumber(j) && j->valuedouble == 0);
    if (noop[0] == '"')
        return cJSON_IsString(j) && strlen(j->valuestring) == strlen(noop) - 2 &&
               !strncmp(j->valuestring, noop + 1, strlen(noop) - 2);
    return cJSON_IsNumber(j) && j->valuedouble == strtod(noop, NULL);
}

static int apply_noop(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    if (value_is(j, k->noop)) return 0;
    char *text = cJSON_PrintUnformatted(j);
    fail(x, key, "%s is not supported yet: %s", text ? text : "this value", k->why);
    free(text);
    return -1;
}

/* ---- rows with their own function ---------------------------------------- */

/* A value a DeepSpeed key maps to, stored as if given under that key. */
static int store_text(ds_ctx *x, size_t off, const char *key, const char *value)
{
    return dt_cfg_file_store(x->f, x->c, dt_cfg_opt_at(off), key, (dt_cfg_val){.s = value},
                             x->err, x->n);
}

/* A value a key implies without naming it (activation_checkpointing:
 * full recomputation; sequence_parallel_size: Ulysses): dtrain's own key
 * for the option may choose another without a conflict. */
static int store_implied(ds_ctx *x, size_t off, const char *key, const char *value)
{
    char who[DT_CONFIG_PATH + 128];
    dt_cfg_json_who(who, sizeof who, x->path, key);
    return dt_cfg_store(x->c, dt_cfg_opt_at(off), (dt_cfg_val){.s = value}, who, x->err, x->n);
}

static int set_option(ds_ctx *x, size_t off, const char *key, const cJSON *j)
{
    return dt_cfg_file_set_json(x->f, x->c, dt_cfg_opt_at(off), key, j, NULL, x->err, x->n);
}

static int own_betas(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    (void)k;
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != 2)
        return fail(x, key, "expected an array of 2 numbers");
    char item[128];
    dt_strf(item, sizeof item, "%s[0]", key);
    if (set_option(x, offsetof(dt_train_config, beta1), item, cJSON_GetArrayItem(j, 0)))
        return -1;
    dt_strf(item, sizeof item, "%s[1]", key);
    return set_option(x, offsetof(dt_train_config, beta2), item, cJSON_GetArrayItem(j, 1));
}

/* A boolean the section's type reads (adam_w_mode), one that picks an
 * implementation of the same formula (torch_adam), or one that asks for
 * what dtrain always does (synchronize_checkpoint_boundary: its kernels are
 * synchronous): nothing to store. */
static int own_bool(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    (void)k;
    return cJSON_IsBool(j) ? 0 : fail(x, key, "expected a boolean");
}

/* The floor of the decay (warmup_min_lr, cos_min_ratio). WarmupLR has no
 * decay: there DeepSpeed's warmup_min_lr is where the warmup starts, and
 * dtrain's warmup starts from 0. */
static int own_floor(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    if (strcasecmp(x->type, "WarmupLR") || (cJSON_IsNumber(j) && j->valuedouble == 0))
        return set_option(x, k->off, key, j);
    return fail(x, key, "is not supported yet with WarmupLR: it has no decay to a floor, and "
                "dtrain's warmup starts from 0, not from a minimum; leave it out, or use "
                "WarmupDecayLR or WarmupCosineLR");
}

static int own_bf16(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    if (own_bool(x, k, key, j)) return -1;
    return store_text(x, offsetof(dt_train_config, dtype), key, cJSON_IsTrue(j) ? "bf16" : "fp32");
}

static int own_fp16(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    if (own_bool(x, k, key, j)) return -1;
    if (cJSON_IsFalse(j)) return 0;
    return fail(x, key, "fp16 with loss scaling is not supported yet; use \"bf16\": "
                "{\"enabled\": true} (or --dtype bf16)");
}

/* In elements, DeepSpeed's unit; fp32 gradients, so 4 bytes each. */
static int own_bucket(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 1))
        return fail(x, key, "want a number of elements >= 1");
    dt_cfg_val v = {.d = j->valuedouble * sizeof(float) / 1048576.0};
    return dt_cfg_file_store(x->f, x->c, dt_cfg_opt_at(k->off), key, v, x->err, x->n);
}

/* The scheduler's peak rate is the rate, whatever optimizer.params.lr
 * said (DeepSpeed's rule): it replaces that key's value, not conflicts. */
static int own_max_lr(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    x->f->key[dt_cfg_opt_at(k->off)][0] = 0;
    return set_option(x, k->off, key, j);
}

static int zero_other(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    (void)k, (void)j;
    return fail(x, key, "is not supported: dtrain's ZeRO reads stage, reduce_bucket_size (the "
                "DDP bucket at stage 0), overlap_comm, stage3_prefetch_bucket_size, "
                "stage3_max_live_parameters, stage3_param_persistence_threshold, "
                "offload_optimizer, offload_param, sub_group_size, zero_quantized_weights, "
                "zero_hpz_partition_size and zero_quantized_gradients; remove it");
}

/* An offload section's keys: each a configuration field, or accepted and
 * changing nothing (0), or refused with why (`no`). */
typedef struct {
    const char *name;
    size_t off;
    const char *no;
} offload_key;

/* Why offload_optimizer's and offload_param's nvme_path must agree. */
static const char one_path[] = "dtrain keeps offload_param's pieces in the file of "
                               "offload_optimizer's state, so both sections name one directory "
                               "(--nvme-path)";

static int own_offload_keys(ds_ctx *x, const char *key, const cJSON *j, const offload_key *keys,
                            size_t nkeys, const char *names)
{
    if (!cJSON_IsObject(j)) return fail(x, key, "expected an object {\"device\": ...}");
    for (const cJSON *it = j->child; it; it = it->next) {
        char sub[160];
        snprintf(sub, sizeof sub, "%s.%s", key, it->string);
        size_t i = 0;
        while (i < nkeys && strcmp(keys[i].name, it->string)) i++;
        if (i == nkeys) {
            char why[200];
            snprintf(why, sizeof why, "is not a key dtrain reads (%s)", names);
            return fail(x, sub, why);
        }
        if (keys[i].no) return fail(x, sub, keys[i].no);
        if (!keys[i].off && !cJSON_IsBool(it)) return fail(x, sub, "expected a boolean");
        const char *why = !strcmp(keys[i].name, "nvme_path") ? one_path : NULL;
        if (keys[i].off && dt_cfg_file_set_json(x->f, x->c, dt_cfg_opt_at(keys[i].off), sub, it,
                                                why, x->err, x->n))
            return -1;
    }
    return 0;
}

/* zero_optimization.offload_optimizer: {device, nvme_path, buffer_count}
 * -> offload_optimizer, nvme_path, offload_buffers; pin_memory and
 * fast_init concern device memory, which a CPU run does not have, and are
 * accepted either way. */
static int own_offload(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    (void)k;
    static const offload_key keys[] = {
        {"device", offsetof(dt_train_config, offload_optimizer), NULL},
        {"nvme_path", offsetof(dt_train_config, nvme_path), NULL},
        {"buffer_count", offsetof(dt_train_config, offload_buffers), NULL},
        {"pin_memory", 0, NULL},
        {"fast_init", 0, NULL}};
    return own_offload_keys(x, key, j, keys, sizeof keys / sizeof keys[0],
                            "device, nvme_path, buffer_count, pin_memory, fast_init");
}

/* zero_optimization.offload_param: {device, nvme_path} -> offload_param,
 * nvme_path (one path for both sections: two different ones are refused,
 * naming both, where DeepSpeed would use each). DeepSpeed's swap buffers do not
 * exist here: each piece has its own buffer, read one segment ahead of its
 * gather, and stage3_max_live_parameters bounds what is gathered. */
static int own_offload_param(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    (void)k;
    static const char no_pool[] = "is not supported: dtrain reads each piece into a buffer of "
                                  "its own just ahead of its gather (bounded by "
                                  "stage3_max_live_parameters); remove it";
    static const offload_key keys[] = {
        {"device", offsetof(dt_train_config, offload_param), NULL},
        {"nvme_path", offsetof(dt_train_config, nvme_path), NULL},
        {"pin_memory", 0, NULL},
        {"buffer_count", 0, no_pool},
        {"buffer_size", 0, no_pool},
        {"max_in_cpu", 0, no_pool}};
    return own_offload_keys(x, key, j, keys, sizeof keys / sizeof keys[0],
                            "device, nvme_path, pin_memory");
}

/* fp16 is off (on is refused): its loss-scaling settings change nothing. */
static int fp16_other(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    (void)x, (void)k, (void)key, (void)j;
    return 0;
}

/* ---- the sections --------------------------------------------------------- */

static int optimizer_type(ds_ctx *x, const cJSON *params)
{
    const cJSON *wmode = params ? cJSON_GetObjectItemCaseSensitive(params, "adam_w_mode") : NULL;
    const char *t = x->type, *mapped = NULL;
    if (!strcasecmp(t, "adamw")) mapped = "adamw";
    else if (!strcasecmp(t, "adam")) mapped = cJSON_IsFalse(wmode) ? "adam" : "adamw";
    else if (!strcasecmp(t, "sgd")) mapped = "sgd";
    if (!mapped)
        return fail(x, "optimizer.type", "unsupported optimizer '%s' (AdamW, Adam, SGD)", t);
    return store_text(x, offsetof(dt_train_config, optimizer), "optimizer.type", mapped);
}

static int scheduler_type(ds_ctx *x, const cJSON *params)
{
    (void)params;
    static const char *const types[][2] = {
        {"WarmupLR", "constant"}, {"WarmupDecayLR", "linear"}, {"WarmupCosineLR", "cosine"}};
    for (int i = 0; i < 3; i++)
        if (!strcasecmp(x->type, types[i][0]))
            return store_text(x, offsetof(dt_train_config, lr_schedule), "scheduler.type",
                              types[i][1]);
    return fail(x, "scheduler.type", "unsupported scheduler '%s' (WarmupLR, WarmupDecayLR, "
                "WarmupCosineLR)", x->type);
}

/* DeepSpeed warms up along a log curve unless told otherwise. */
static int scheduler_end(ds_ctx *x, const cJSON *params)
{
    const cJSON *wn = cJSON_GetObjectItemCaseSensitive(params, "warmup_num_steps");
    const cJSON *wt = cJSON_GetObjectItemCaseSensitive(params, "warmup_type");
    if (cJSON_IsNumber(wn) && wn->valuedouble > 0 && !wt)
        DT_WARN("%s: scheduler.params.warmup_type is unset (DeepSpeed's default: log); dtrain "
                "warms up linearly", x->path);
    return 0;
}

/* The section asks for checkpointing: each layer's input, the layer re-run
 * in backward. dtrain's own "recompute" key is applied after it and wins. */
static int checkpointing_begin(ds_ctx *x, const cJSON *keys)
{
    (void)keys;
    return store_implied(x, offsetof(dt_train_config, recompute), "activation_checkpointing",
                         "full");
}

static const ds_key optimizer_keys[] = {
    OPTION("lr", lr, NULL),
    OWN("betas", beta1, own_betas, "Adam|AdamW"),
    OPTION("eps", eps, "Adam|AdamW"),
    OPTION("weight_decay", weight_decay, NULL),
    OPTION("momentum", momentum, "SGD"),
    OWN("adam_w_mode", optimizer, own_bool, "Adam"),
    OWN("torch_adam", optimizer, own_bool, "Adam|AdamW"),
};

static const ds_key scheduler_keys[] = {
    OWN("warmup_max_lr", lr, own_max_lr, NULL),
    OWN("warmup_min_lr", min_lr, own_floor, NULL),
    OPTION("warmup_num_steps", warmup_steps, NULL),
    OPTION("total_num_steps", steps, NULL),
    OWN("cos_min_ratio", min_lr_ratio, own_floor, NULL),
    NOOP("warmup_type", "\"linear\"",
         "dtrain warms up linearly from 0 (DeepSpeed's log warmup is not there); write "
         "\"linear\""),
    NOOP("warmup_min_ratio", "0",
         "dtrain warms up from 0, not from a fraction of the peak; leave it out or write 0"),
    NOOP("last_batch_iteration", "-1",
         "the schedule's position comes from the checkpoint: use --resume"),
};

static const ds_key bf16_keys[] = {OWN("enabled", dtype, own_bf16, NULL)};
static const ds_key fp16_keys[] = {OWN("enabled", dtype, own_fp16, NULL)};

static const ds_key zero_keys[] = {
    OPTION("stage", zero_stage, NULL),
    OWN("reduce_bucket_size", bucket_mb, own_bucket, NULL),
    OPTION("stage3_prefetch_bucket_size", zero_prefetch_elems, NULL),
    OPTION("stage3_max_live_parameters", zero_max_live, NULL),
    OPTION("stage3_param_persistence_threshold", zero_persist, NULL),
    OWN("offload_optimizer", offload_optimizer, own_offload, NULL),
    OWN("offload_param", offload_param, own_offload_param, NULL),
    OPTION("sub_group_size", sub_group_size, NULL),
    OPTION("zero_quantized_weights", zero_qwz, NULL),
    OPTION("zero_hpz_partition_size", zero_hpz, NULL),
    OPTION("zero_quantized_gradients", zero_qgz, NULL),
    NOOP("overlap_comm", "true",
         "dtrain's DDP always overlaps each bucket's all-reduce with the rest of backward; "
         "leave it out or write true"),
};

/* DeepSpeed's partition methods: "uniform" balances layer counts,
 * "parameters" parameter counts; its default "best" is not one dtrain has. */
static int own_partition(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    if (cJSON_IsString(j) && !strcasecmp(j->valuestring, "uniform"))
        return store_text(x, k->off, key, "uniform");
    if (cJSON_IsString(j) && !strcasecmp(j->valuestring, "parameters"))
        return store_text(x, k->off, key, "params");
    return fail(x, key, "want \"uniform\" or \"parameters\" (--pp-partition cost balances by "
                "measured time; DeepSpeed's \"type:REGEX\" and \"best\" are not supported)");
}

static const ds_key pipeline_keys[] = {
    OPTION("stages", pp, NULL),
    OWN("partition", pp_partition, own_partition, NULL),
    NOOP("activation_checkpoint_interval", "off",
         "dtrain recomputes by --recompute (or the activation_checkpointing section) for every "
         "layer; leave it out or write 0"),
};

/* DeepSpeed's AutoTP training section: the tensor-parallel size. */
static const ds_key tensor_parallel_keys[] = {OPTION("autotp_size", tp, NULL)};

/* DeepSpeed's sequence_parallel_size is DeepSpeed-Ulysses: context
 * parallelism by all-to-all to heads (a --cp-algo flag still wins). */
static int own_ulysses(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    if (set_option(x, k->off, key, j)) return -1;
    return x->c->cp > 1 ? store_implied(x, offsetof(dt_train_config, cp_algo), key, "ulysses")
                        : 0;
}

static const ds_key aio_keys[] = {
    OPTION("block_size", aio_block_size, NULL),
    OPTION("queue_depth", aio_queue_depth, NULL),
    NOOP("single_submit", "false",
         "dtrain submits every request as it is queued; leave it out or write false"),
    NOOP("overlap_events", "true",
         "dtrain always overlaps the I/O with the update; leave it out or write true"),
    NOOP("thread_count", "1",
         "dtrain's I/O runs on io_uring from the rank's own thread; leave it out or write 1"),
};

static const ds_key data_types_keys[] = {OPTION("grad_accum_dtype", grad_accum_dtype, NULL)};

static const ds_key checkpointing_keys[] = {
    NOOP("partition_activations", "off",
         "it splits the kept layer inputs across the tensor-parallel ranks; dtrain's "
         "--sequence-parallel (with --tp) does that for the residual rows; leave it out or "
         "write false"),
    NOOP("cpu_checkpointing", "off",
         "it moves partitioned checkpoints to host memory; dtrain's activations are in host "
         "memory already and not partitioned; leave it out or write false"),
    NOOP("contiguous_memory_optimization", "off",
         "it copies partitioned checkpoints into one buffer; dtrain's activations are one "
         "arena already and not partitioned; leave it out or write false"),
    NOOP("number_checkpoints", "off",
         "it sizes contiguous_memory_optimization's buffer, which dtrain does not have (full "
         "recomputation keeps one input per layer); leave it out or write null"),
    OWN("synchronize_checkpoint_boundary", recompute, own_bool, NULL),
    NOOP("profile", "off",
         "timing the checkpointed forward and backward is not supported yet; leave it out or "
         "write false"),
};

#define KEYS(t) t, sizeof t / sizeof t[0]
static const ds_section sections[] = {
    {"optimizer", 0, 1, KEYS(optimizer_keys), optimizer_type, NULL, NULL},
    {"scheduler", 1, 1, KEYS(scheduler_keys), scheduler_type, scheduler_end, NULL},
    {"bf16", 1, 0, KEYS(bf16_keys), NULL, NULL, NULL},
    {"fp16", 1, 0, KEYS(fp16_keys), NULL, NULL, fp16_other},
    {"zero_optimization", 1, 0, KEYS(zero_keys), NULL, NULL, zero_other},
    {"data_types", 1, 0, KEYS(data_types_keys), NULL, NULL, NULL},
    {"aio", 1, 0, KEYS(aio_keys), NULL, NULL, NULL},
    {"pipeline", 1, 0, KEYS(pipeline_keys), NULL, NULL, NULL},
    {"tensor_parallel", 1, 0, KEYS(tensor_parallel_keys), NULL, NULL, NULL},
    {"activation_checkpointing", 1, 0, KEYS(checkpointing_keys), checkpointing_begin, NULL,
     NULL},
};

/* Top-level keys that are no section (the options' aliases aside). */
static const ds_key root_keys[] = {
    OWN("sequence_parallel_size", cp, own_ulysses, NULL),
    NOOP("wall_clock_breakdown", "false",
         "a breakdown of each step's time is not supported yet; the step line shows the step's "
         "time and, with DDP, the communication backward did not hide"),
};

/* ---- reading a section ---------------------------------------------------- */

static int apply_key(ds_ctx *x, const ds_key *k, const char *key, const cJSON *j)
{
    if (k->only && !in_list(k->only, x->type))
        return fail(x, key, "is not a parameter of %s (only of %s)", x->type, k->only);
    switch (k->kind) {
    case K_OPTION: return set_option(x, k->off, key, j);
    case K_NOOP: return apply_noop(x, k, key, j);
    default: return k->fn(x, k, key, j);
    }
}

static int section_key(ds_ctx *x, const ds_section *s, const cJSON *it)
{
    char key[160];
    dt_strf(key, sizeof key, "%s.%s%s", s->name, s->typed ? "params." : "", it->string);
    for (size_t i = 0; i < s->nkeys; i++)
        if (!strcmp(s->keys[i].name, it->string)) return apply_key(x, &s->keys[i], key, it);
    if (s->other) return s->other(x, NULL, key, it);
    warn_unknown(x, key);
    return 0;
}

/* {"type": "...", "params": {...}}: the type into x->type, the params (NULL
 * when absent) into *params; other keys are warned about. */
static int typed_section(ds_ctx *x, const char *name, const cJSON *j, const cJSON **params)
{
    char key[64];
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    *params = cJSON_GetObjectItemCaseSensitive(j, "params");
    if (!t) return fail(x, name, "missing \"type\"");
    dt_strf(key, sizeof key, "%s.type", name);
    if (!cJSON_IsString(t)) return fail(x, key, "expected a string");
    dt_strf(key, sizeof key, "%s.params", name);
    if (*params && !cJSON_IsObject(*params)) return fail(x, key, "expected an object");
    x->type = t->valuestring;
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        if (strcmp(it->string, "type") && strcmp(it->string, "params")) {
            dt_strf(key, sizeof key, "%s.%s", name, it->string);
            warn_unknown(x, key);
        }
    }
    return 0;
}

static int run_section(ds_ctx *x, const ds_section *s, const cJSON *j)
{
    if (!cJSON_IsObject(j)) return fail(x, s->name, "expected an object");
    const cJSON *keys = j, *it;
    if (s->typed && typed_section(x, s->name, j, &keys)) return -1;
    if (s->begin && s->begin(x, keys)) return -1;
    if (keys)
        cJSON_ArrayForEach(it, keys)
            if (section_key(x, s, it)) return -1;
    return s->end && keys ? s->end(x, keys) : 0;
}

int dt_cfg_deepspeed_item(dt_cfg_file *f, dt_train_config *c, const cJSON *it, int pass,
                          char *err, size_t n)
{
    ds_ctx x = {f, c, f->path, "", err, n};
    const char *k = it->string;
    for (size_t i = 0; i < sizeof root_keys / sizeof root_keys[0]; i++)
        if (!strcmp(root_keys[i].name, k))
            return pass == 1 ? apply_key(&x, &root_keys[i], k, it) : 0;
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
        const ds_section *s = &sections[i];
        /* "optimizer": a string is dtrain's own key, an object DeepSpeed's section. */
        if (strcmp(s->name, k) || (!strcmp(k, "optimizer") && !cJSON_IsObject(it))) continue;
        return pass == s->pass ? run_section(&x, s, it) : 0;
    }
    return 1;
}

/* ---- the list of keys ------------------------------------------------------ */

const char *dt_cfg_deepspeed_key(int i, char *buf, size_t n)
{
    for (int o = 0; o < dt_cfg_noptions; o++)
        if (dt_cfg_options[o].alias && i-- == 0) return dt_cfg_options[o].alias;
    for (size_t r = 0; r < sizeof root_keys / sizeof root_keys[0]; r++)
        if (i-- == 0) return root_keys[r].name;
    for (size_t s = 0; s < sizeof sections / sizeof sections[0]; s++) {
        const ds_section *sec = &sections[s];
        if (sec->typed && i-- == 0) return dt_strf(buf, n, "%s.type", sec->name), buf;
        for (size_t k = 0; k < sec->nkeys; k++) {
            if (i-- > 0) continue;
            dt_strf(buf, n, "%s.%s%s", sec->name, sec->typed ? "params." : "", sec->keys[k].name);
            return buf;
        }
    }
    return NULL;
}
