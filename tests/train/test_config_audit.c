/*
 * The audit of every setting `dtrain train` accepts: each option of the
 * table (as a flag and as a JSON key) and each DeepSpeed key the reader
 * knows must either change the parsed configuration (the option's own
 * field, or for a DeepSpeed key some field, differs from the same run
 * without it) or be refused with a message. A key with no counterpart may
 * be accepted only with the value that changes nothing, and that is
 * checked too (the fields stay equal).
 *
 * The rows below are walked against the library's own lists
 * (dt_cfg_options, dt_cfg_deepspeed_key): an option or a DeepSpeed key
 * added without a row here fails this test, so a setting cannot be
 * accepted and silently ignored without someone saying what it changes.
 * What the trainer does with each field is checked by the end-to-end tests
 * (tests/train, tests/parallel, tests/model).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config_util.h"
#include "train/config/agree.h"
#include "train/config/internal.h"

/* ---- options of the table ------------------------------------------------ */

/* A value other than the default; context: flags the option needs to act
 * (parsed into the baseline too); refused: a needle of the message, or
 * NULL when the value must be accepted and change the option's field. */
typedef struct {
    const char *flag, *value, *context, *refused;
} opt_row;

static const opt_row opt_rows[] = {
    {"model", "gpt2", "", NULL},
    {"n-layer", "2", "", NULL},
    {"n-head", "2", "", NULL},
    {"n-embd", "64", "", NULL},
    {"vocab-size", "300", "", NULL},
    {"block-size", "64", "", NULL},
    {"blocks", "ln_1:layernorm,attn:attention", "", NULL},
    {"init", "w.safetensors", "", NULL},
    {"data", "d.bin", "", NULL},
    {"val-data", "v.bin", "", NULL},
    {"val-fraction", "0.2", "--data d.bin", NULL},
    {"val-fraction", "0.2", "", "built-in corpus has its own validation"},
    {"val-fraction", "0.2", "--data d.bin --val-data v.bin", "--val-data is given instead"},
    {"shuffle", "0", "", NULL},
    {"batch-size", "4", "", NULL},
    {"seq-len", "64", "", NULL},
    {"grad-accum", "2", "", NULL},
    {"train-batch-size", "16", "", NULL},
    {"steps", "50", "", NULL},
    {"optimizer", "sgd", "", NULL},
    {"lr", "0.01", "", NULL},
    {"min-lr", "1e-4", "", NULL},
    {"min-lr-ratio", "0.1", "", NULL},
    {"lr-schedule", "linear", "", NULL},
    {"warmup-steps", "10", "", NULL},
    {"num-experts", "8", "", NULL},
    {"num-experts", "4", "--strategy ps", "trains with --strategy ddp"},
    {"num-experts", "4", "--tp 2", NULL},
    {"num-experts", "4", "--cp 2", NULL},
    {"moe-ffn-hidden-size", "100", "--num-experts 4", NULL},
    {"moe-ffn-hidden-size", "100", "", "add --num-experts E"},
    {"moe-router-topk", "1", "--num-experts 4", NULL},
    {"moe-router-topk", "5", "--num-experts 4", "K <= 4"},
    {"moe-router-topk", "0", "--num-experts 4", "0 must be in [1, 256]"},
    {"moe-router-topk", "2", "", "add --num-experts E"},
    {"moe-expert-capacity-factor", "1.25", "--num-experts 4", NULL},
    {"moe-expert-capacity-factor", "0", "--num-experts 4", "leave it out for dropless"},
    {"moe-expert-capacity-factor", "-1", "--num-experts 4", "-1 must be in [0, 1e+06]"},
    {"moe-aux-loss-coeff", "0.001", "--num-experts 4", NULL},
    {"moe-z-loss-coeff", "0.001", "--num-experts 4", NULL},
    {"moe-router-enable-expert-bias", "1", "--num-experts 4", NULL},
    {"moe-router-enable-expert-bias", "1", "--num-experts 4 --out /tmp/x --resume", NULL},
    {"moe-router-bias-update-rate", "0.01", "--num-experts 4 --moe-router-enable-expert-bias",
     NULL},
    {"moe-router-bias-update-rate", "0.01", "--num-experts 4",
     "add --moe-router-enable-expert-bias"},
    {"moe-per-layer-logging", "1", "--num-experts 4", NULL},
    {"arch", "llama", "--n-head 4 --n-embd 32", NULL},
    {"n-kv-head", "2", "--arch llama --n-head 4 --n-embd 32", NULL},
    {"n-kv-head", "2", "", "an option of the Llama family"},
    {"ffn-hidden-size", "64", "--arch llama", NULL},
    {"rope-theta", "500000", "--arch llama", NULL},
    {"norm-eps", "1e-6", "--arch llama", NULL},
    {"tie-word-embeddings", "1", "--arch llama", NULL},
    {"moe-router-force-load-balancing", "1", "--num-experts 4", NULL},
    {"ep", "2", "--num-experts 4", NULL},
    {"ep", "2", "", "add --num-experts E"},
    {"ep", "2", "--num-experts 4 --pp 2", NULL},
    {"ep", "2", "--num-experts 4 --recompute full", NULL},
    {"beta1", "0.8", "", NULL},
    {"beta2", "0.95", "", NULL},
    {"eps", "1e-6", "", NULL},
    {"weight-decay", "0.1", "", NULL},
    {"momentum", "0.9", "--optimizer sgd", NULL},
    {"grad-clip", "0.5", "", NULL},
    {"dtype", "bf16", "", NULL},
    {"comm-dtype", "bf16", "", NULL},
    {"comm-dtype", "fp32", "--strategy dp", "--comm-dtype sets how --strategy ddp"},
    {"grad-accum-dtype", "bf16", "--dtype bf16", NULL},
    {"grad-accum-dtype", "bf16", "", "it needs --dtype bf16"},
    {"recompute", "selective", "", NULL},
    {"recompute", "full", "", NULL},
    {"recompute", "partial", "", "unknown value 'partial' (one of none|selective|full)"},
    {"threads", "2", "", NULL},
    {"threads", "4096", "", "[0, 1024]: more threads than cores"},
    {"seed", "7", "", NULL},
    {"pp", "2", "", NULL},
    {"pp", "2", "--strategy ps", "cannot hold stages"},
    {"tp", "2", "", NULL},
    {"tp", "2", "--strategy ps", "cannot split it"},
    {"dp", "1", "", NULL},
    {"dp", "2", "--strategy ps", "--dp sets the data-parallel size of --strategy ddp"},
    {"sequence-parallel", "1", "--tp 2", NULL},
    {"sequence-parallel", "1", "", "add --tp 2 or more"},
    {"zero-quantized-weights", "1", "--zero-stage 3", NULL},
    {"zero-quantized-weights", "1", "--zero-stage 2", "applies to --zero-stage 3"},
    {"zero-quantized-weights", "1", "--zero-stage 3 --dtype bf16", NULL},
    {"zero-quantized-gradients", "1", "--zero-stage 3", NULL},
    {"zero-quantized-gradients", "1", "--zero-stage 2", "applies to --zero-stage 3"},
    {"zero-quantized-gradients", "1", "--zero-stage 3 --grad-accum-dtype bf16 --dtype bf16",
     "--grad-accum-dtype fp32"},
    {"zero-quantized-gradients", "1", "--zero-stage 3 --comm-dtype bf16", "drop --comm-dtype"},
    {"zero-qgz-bits", "4", "--zero-stage 3 --zero-quantized-gradients", NULL},
    {"offload-overlap", "0", "--zero-stage 3 --offload-optimizer nvme --nvme-path /tmp", NULL},
    {"offload-overlap", "1", "--zero-stage 2 --offload-optimizer nvme --nvme-path /tmp",
     "this run has stage 2"},
    {"offload-overlap", "1", "--zero-stage 3 --offload-optimizer nvme --offload-param nvme "
     "--nvme-path /tmp", "drop --offload-overlap"},
    {"offload-overlap", "0", "--zero-stage 3", "applies to --offload-optimizer nvme"},
    {"zero-qgz-bits", "6", "--zero-stage 3 --zero-quantized-gradients", "use 8 or 4"},
    {"zero-qgz-bits", "4", "--zero-stage 3", "add --zero-quantized-gradients"},
    {"zero-hpz-partition-size", "2", "--zero-stage 3", NULL},
    {"zero-hpz-partition-size", "2", "--zero-stage 2", "applies to --zero-stage 3"},
    {"zero-quant-block", "64", "--zero-stage 3 --zero-quantized-weights", NULL},
    {"zero-quant-block", "64", "--zero-stage 3", "add --zero-quantized-weights"},
    {"offload-optimizer", "cpu", "", NULL},
    {"offload-optimizer", "nvme", "", "needs --nvme-path DIR"},
    {"offload-optimizer", "cpu", "--strategy ps", "updates elsewhere"},
    {"nvme-path", "/var/tmp", "--offload-optimizer nvme --nvme-path /tmp", NULL},
    {"nvme-path", "/tmp", "", "applies to --offload-optimizer nvme"},
    {"offload-param", "cpu", "--zero-stage 3", NULL},
    {"offload-param", "nvme", "--zero-stage 3 --offload-optimizer nvme --nvme-path /tmp", NULL},
    {"offload-param", "nvme", "--zero-stage 3", "add --offload-optimizer nvme"},
    {"offload-param", "cpu", "--zero-stage 2", "applies to --zero-stage 3"},
    {"offload-param", "nvme",
     "--zero-stage 3 --offload-optimizer nvme --nvme-path /tmp --dtype bf16", "keeps fp32 pieces"},
    {"sub-group-size", "65536", "--offload-optimizer nvme --nvme-path /tmp", NULL},
    {"sub-group-size", "65536", "", "applies to --offload-optimizer nvme"},
    {"offload-buffers", "6", "--offload-optimizer nvme --nvme-path /tmp", NULL},
    {"offload-buffers", "6", "", "applies to --offload-optimizer nvme"},
    {"aio-block-size", "8192", "--offload-optimizer nvme --nvme-path /tmp", NULL},
    {"aio-block-size", "5000", "--offload-optimizer nvme --nvme-path /tmp", "a multiple of 4096"},
    {"aio-queue-depth", "16", "--offload-optimizer nvme --nvme-path /tmp", NULL},
    {"aio-queue-depth", "16", "", "applies to --offload-optimizer nvme"},
    {"cp", "2", "", NULL},
    {"cp", "2", "--strategy ps", "cannot split them"},
    {"cp-algo", "ulysses", "--cp 2", NULL},
    {"cp-algo", "ulysses", "", "add --cp 2 or more"},
    {"pp-schedule", "gpipe", "--pp 2", NULL},
    {"pp-schedule", "gpipe", "", "add --pp 2 or more"},
    {"pp-partition", "params", "--pp 2", NULL},
    {"pp-partition", "cost", "--pp 2", NULL},
    {"pp-virtual", "2", "--pp 2 --pp-schedule interleaved", NULL},
    {"pp-virtual", "2", "", "add --pp 2 or more"},
    {"trace", "t.json", "", NULL},
    {"zero-stage", "1", "", NULL},
    {"zero-stage", "3", "", NULL},
    {"zero-stage", "2", "--strategy ps", "shards the state over the ranks of --strategy ddp"},
    {"zero-prefetch", "2", "--zero-stage 3", NULL},
    {"zero-prefetch", "2", "--zero-stage 2", "applies to --zero-stage 3"},
    {"zero-reshard-after-forward", "0", "--zero-stage 3", NULL},
    {"zero-prefetch-elems", "1e6", "--zero-stage 3", NULL},
    {"zero-prefetch-elems", "1e6", "--zero-stage 3 --zero-prefetch 1", "give one of them"},
    {"zero-max-live", "1e6", "--zero-stage 3", NULL},
    {"zero-persist", "1e4", "--zero-stage 3", NULL},
    {"zero-persist", "1e4", "--zero-stage 1", "applies to --zero-stage 3"},
    {"strategy", "dp", "", NULL},
    {"bucket-mb", "5", "", NULL},
    {"devices", "2", "--strategy dp", NULL},
    {"servers", "2", "--strategy ps", NULL},
    {"ps-mode", "async", "--strategy ps", NULL},
    {"staleness", "4", "--strategy ps --ps-mode async", NULL},
    {"fixed-staleness", "1", "--strategy ps --ps-mode async", NULL},
    {"compress", "int8", "--strategy ps", NULL},
    {"comm-algo", "allreduce=ring", "", NULL},
    {"eval-every", "10", "", NULL},
    {"eval-every", "10", "--eval-batches 0", "needs eval_batches > 0"},
    {"eval-batches", "2", "", NULL},
    {"eval-batches", "2", "--data d.bin --val-fraction 0", "needs validation data"},
    {"out", "ck", "", NULL},
    {"save-every", "5", "--out ck", NULL},
    {"keep-last", "5", "--out ck", NULL},
    {"keep-last", "5", "", "needs --out"},
    {"snapshot-every", "4", "", NULL},
    {"resume", "ck/ckpt-00000005", "", NULL},
    {"save-final", "w.safetensors", "", NULL},
    {"save-dtype", "bf16", "--save-final w.safetensors", NULL},
    {"save-dtype", "fp16", "", "add --save-final"},
    {"print-every", "10", "", NULL},
    {"log-ranks", "all", "", NULL},
    {"profile", "1", "", NULL},
    {"log-json", "log.json", "", NULL},
};

/* Parses "train ARGS" onto defaults; 0, 1 (--help) or -1 with err. */
static int parse(dt_train_config *c, const char *args)
{
    dt_config_defaults(c);
    return parse_line(c, args);
}

/* Parsed and validated (on a copy: validation fills inferred values). */
static int accepted(const dt_train_config *c)
{
    dt_train_config v = *c;
    return dt_config_validate(&v, 1, err, sizeof err) == 0;
}

/* The option's value as JSON: strings quoted, the rest as written. */
static void option_json(const dt_cfg_opt *o, const char *value, char *buf, size_t n)
{
    char key[64];
    snprintf(key, sizeof key, "%s", o->flag);
    for (char *p = key; *p; p++) *p = *p == '-' ? '_' : *p;
    int quote = o->type == T_STR || o->type == T_CHOICE;
    snprintf(buf, n, "{\"%s\": %s%s%s}", key, quote ? "\"" : "", value, quote ? "\"" : "");
}

/* One row through one route (the flag, or the JSON key under --config). */
static void check_option_row(const opt_row *r, const dt_cfg_opt *o, int via_json)
{
    dt_train_config base, with;
    char args[1024], json[512];
    const char *route = via_json ? "JSON" : "flag";
    CHECK(parse(&base, r->context) == 0 && accepted(&base), "--%s: context '%s' refused: %s",
          r->flag, r->context, err);
    if (via_json) {
        option_json(o, r->value, json, sizeof json);
        write_json(json);
        snprintf(args, sizeof args, "--config %s %s", json_path, r->context);
    } else {
        snprintf(args, sizeof args, "%s --%s %s", r->context, r->flag, r->value);
    }
    int ok = parse(&with, args) == 0 && accepted(&with);
    if (r->refused) {
        CHECK(!ok && strstr(err, r->refused), "--%s %s (%s, %s): want refused with '%s', got %s",
              r->flag, r->value, route, r->context, r->refused, ok ? "accepted" : err);
        return;
    }
    CHECK(ok, "--%s %s (%s, %s) refused: %s", r->flag, r->value, route, r->context, err);
    CHECK(memcmp((char *)&base + o->off, (char *)&with + o->off, o->size) != 0,
          "--%s %s (%s) was accepted and left its field as it was", r->flag, r->value, route);
}

static void test_every_option(void)
{
    size_t nrows = sizeof opt_rows / sizeof opt_rows[0];
    for (int i = 0; i < dt_cfg_noptions; i++) {
        const dt_cfg_opt *o = &dt_cfg_options[i];
        if (o->type == T_ACTION) continue;
        int rows = 0;
        for (size_t r = 0; r < nrows; r++) {
            if (strcmp(opt_rows[r].flag, o->flag)) continue;
            rows++;
            check_option_row(&opt_rows[r], o, 0);
            check_option_row(&opt_rows[r], o, 1);
        }
        CHECK(rows > 0, "--%s has no row in test_config_audit.c: give a value that changes its "
              "field, or refuse it", o->flag);
    }
    for (size_t r = 0; r < nrows; r++)
        CHECK(dt_cfg_find_flag(opt_rows[r].flag, strlen(opt_rows[r].flag)) >= 0,
              "row for --%s, which is no option", opt_rows[r].flag);
    /* The two actions: --help prints and stops, --config reads a file (its
     * keys are the rows above and below). */
    dt_train_config c;
    fflush(stdout);
    int saved = dup(1);
    FILE *null = fopen("/dev/null", "w");
    dup2(fileno(null), 1);
    int rc = parse(&c, "--help");
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(null);
    CHECK(rc == 1, "--help: rc %d", rc);
    write_json("{\"steps\": 9}");
    char args[300];
    snprintf(args, sizeof args, "--config %s", json_path);
    CHECK(parse(&c, args) == 0 && c.steps == 9, "--config: %s", err);
    /* --dry-run is the command's (cli/train.c prints the memory plan and
     * trains nothing; tests/train/test_dry_run.sh): the parser knows it and
     * it takes no value. */
    int dry = dt_cfg_find_flag("dry-run", 7);
    CHECK(dry >= 0 && dt_cfg_options[dry].type == T_ACTION &&
              (dt_cfg_options[dry].flags & O_NOVAL), "--dry-run is no value-less action");
    CHECK(parse(&c, "--dry-run --steps 9") == 0 && c.steps == 9, "--dry-run: %s", err);
    CHECK(parse(&c, "--dry-run=1") == -1 && strstr(err, "takes no value"), "--dry-run=1: %s",
          err);
}

/* ---- DeepSpeed's keys ------------------------------------------------------ */

/* base: a file without the key; json: the same with it. expect: 'C' the
 * file is accepted and some field differs from base, 'R' refused with the
 * needle (and the key named), 'N' accepted and every field as in base (a
 * value that changes nothing). */
typedef struct {
    const char *key, *base, *json;
    char expect;
    const char *needle;
} ds_row;

#define ADAMW "{\"optimizer\": {\"type\": \"AdamW\"}}"
#define ADAMW_P(p) "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {" p "}}}"
#define ADAM "{\"optimizer\": {\"type\": \"Adam\"}}"
#define ADAM_P(p) "{\"optimizer\": {\"type\": \"Adam\", \"params\": {" p "}}}"
#define SGD "{\"optimizer\": {\"type\": \"SGD\"}}"
#define SGD_P(p) "{\"optimizer\": {\"type\": \"SGD\", \"params\": {" p "}}}"
#define SCHED(t) "{\"scheduler\": {\"type\": \"" t "\"}}"
#define SCHED_P(t, p) "{\"scheduler\": {\"type\": \"" t "\", \"params\": {" p "}}}"
#define ZERO(p) "{\"zero_optimization\": {" p "}}"
#define CKPT(p) "{\"activation_checkpointing\": {" p "}}"
#define NS "not supported yet"

static const ds_row ds_rows[] = {
    {"train_micro_batch_size_per_gpu", "{}", "{\"train_micro_batch_size_per_gpu\": 4}", 'C', NULL},
    {"gradient_accumulation_steps", "{}", "{\"gradient_accumulation_steps\": 2}", 'C', NULL},
    {"gradient_clipping", "{}", "{\"gradient_clipping\": 0.5}", 'C', NULL},
    {"steps_per_print", "{}", "{\"steps_per_print\": 10}", 'C', NULL},
    {"wall_clock_breakdown", "{}", "{\"wall_clock_breakdown\": true}", 'R', NS},
    {"wall_clock_breakdown", "{}", "{\"wall_clock_breakdown\": false}", 'N', NULL},

    {"optimizer.type", "{}", SGD, 'C', NULL},
    {"optimizer.type", "{}", "{\"optimizer\": {\"type\": \"Lion\"}}", 'R', "unsupported"},
    {"optimizer.params.lr", ADAMW, ADAMW_P("\"lr\": 0.01"), 'C', NULL},
    {"optimizer.params.betas", ADAMW, ADAMW_P("\"betas\": [0.8, 0.9]"), 'C', NULL},
    {"optimizer.params.betas", SGD, SGD_P("\"betas\": [0.8, 0.9]"), 'R', "not a parameter of SGD"},
    {"optimizer.params.eps", ADAM, ADAM_P("\"eps\": 1e-6"), 'C', NULL},
    {"optimizer.params.eps", SGD, SGD_P("\"eps\": 1e-6"), 'R', "not a parameter of SGD"},
    {"optimizer.params.weight_decay", SGD, SGD_P("\"weight_decay\": 0.1"), 'C', NULL},
    {"optimizer.params.momentum", SGD, SGD_P("\"momentum\": 0.9"), 'C', NULL},
    {"optimizer.params.momentum", ADAMW, ADAMW_P("\"momentum\": 0.9"), 'R',
     "not a parameter of AdamW"},
    {"optimizer.params.adam_w_mode", ADAM, ADAM_P("\"adam_w_mode\": false"), 'C', NULL},
    {"optimizer.params.adam_w_mode", ADAMW, ADAMW_P("\"adam_w_mode\": false"), 'R',
     "not a parameter of AdamW"},
    /* PyTorch's Adam or DeepSpeed's own: the same formula, dtrain's. */
    {"optimizer.params.torch_adam", ADAM, ADAM_P("\"torch_adam\": true"), 'N', NULL},
    {"optimizer.params.torch_adam", ADAMW, ADAMW_P("\"torch_adam\": false"), 'N', NULL},

    {"scheduler.type", "{}", SCHED("WarmupLR"), 'C', NULL},
    {"scheduler.type", "{}", SCHED("OneCycle"), 'R', "unsupported scheduler"},
    {"scheduler.params.warmup_max_lr", SCHED("WarmupLR"),
     SCHED_P("WarmupLR", "\"warmup_max_lr\": 0.01"), 'C', NULL},
    {"scheduler.params.warmup_min_lr", SCHED("WarmupDecayLR"),
     SCHED_P("WarmupDecayLR", "\"warmup_min_lr\": 1e-5"), 'C', NULL},
    {"scheduler.params.warmup_min_lr", SCHED("WarmupLR"),
     SCHED_P("WarmupLR", "\"warmup_min_lr\": 1e-5"), 'R', NS},
    {"scheduler.params.warmup_min_lr", SCHED("WarmupLR"),
     SCHED_P("WarmupLR", "\"warmup_min_lr\": 0"), 'N', NULL},
    {"scheduler.params.warmup_num_steps", SCHED("WarmupLR"),
     SCHED_P("WarmupLR", "\"warmup_num_steps\": 5, \"warmup_type\": \"linear\""), 'C', NULL},
    {"scheduler.params.total_num_steps", SCHED("WarmupDecayLR"),
     SCHED_P("WarmupDecayLR", "\"total_num_steps\": 50"), 'C', NULL},
    {"scheduler.params.cos_min_ratio", SCHED("WarmupCosineLR"),
     SCHED_P("WarmupCosineLR", "\"cos_min_ratio\": 0.1"), 'C', NULL},
    {"scheduler.params.cos_min_ratio", SCHED("WarmupLR"),
     SCHED_P("WarmupLR", "\"cos_min_ratio\": 0.1"), 'R', NS},
    {"scheduler.params.warmup_type", SCHED("WarmupLR"),
     SCHED_P("WarmupLR", "\"warmup_type\": \"log\""), 'R', NS},
    {"scheduler.params.warmup_type", SCHED("WarmupLR"),
     SCHED_P("WarmupLR", "\"warmup_type\": \"linear\""), 'N', NULL},
    {"scheduler.params.warmup_min_ratio", SCHED("WarmupCosineLR"),
     SCHED_P("WarmupCosineLR", "\"warmup_min_ratio\": 0.1"), 'R', NS},
    {"scheduler.params.warmup_min_ratio", SCHED("WarmupCosineLR"),
     SCHED_P("WarmupCosineLR", "\"warmup_min_ratio\": 0"), 'N', NULL},
    {"scheduler.params.last_batch_iteration", SCHED("WarmupLR"),
     SCHED_P("WarmupLR", "\"last_batch_iteration\": 5"), 'R', "--resume"},
    {"scheduler.params.last_batch_iteration", SCHED("WarmupLR"),
     SCHED_P("WarmupLR", "\"last_batch_iteration\": -1"), 'N', NULL},

    {"bf16.enabled", "{}", "{\"bf16\": {\"enabled\": true}}", 'C', NULL},
    {"communication_data_type", "{}", "{\"communication_data_type\": \"bf16\"}", 'C', NULL},
    {"data_types.grad_accum_dtype", "{\"bf16\": {\"enabled\": true}}",
     "{\"bf16\": {\"enabled\": true}, \"data_types\": {\"grad_accum_dtype\": \"bf16\"}}", 'C', NULL},
    {"data_types.grad_accum_dtype", "{}", "{\"data_types\": {\"grad_accum_dtype\": \"fp32\"}}",
     'N', NULL},
    {"fp16.enabled", "{}", "{\"fp16\": {\"enabled\": true}}", 'R', NS},
    {"fp16.enabled", "{}", "{\"fp16\": {\"enabled\": false, \"loss_scale\": 0}}", 'N', NULL},

    {"pipeline.stages", "{}", "{\"pipeline\": {\"stages\": 2}}", 'C', NULL},
    {"tensor_parallel.autotp_size", "{}", "{\"tensor_parallel\": {\"autotp_size\": 2}}", 'C',
     NULL},
    {"sequence_parallel_size", "{}", "{\"sequence_parallel_size\": 2}", 'C', NULL},
    {"pipeline.partition", "{\"pipeline\": {\"stages\": 2}}",
     "{\"pipeline\": {\"stages\": 2, \"partition\": \"parameters\"}}", 'C', NULL},
    {"pipeline.partition", "{}", "{\"pipeline\": {\"partition\": \"best\"}}", 'R',
     "not supported"},
    {"pipeline.activation_checkpoint_interval", "{}",
     "{\"pipeline\": {\"activation_checkpoint_interval\": 2}}", 'R', NS},
    {"pipeline.activation_checkpoint_interval", "{}",
     "{\"pipeline\": {\"activation_checkpoint_interval\": 0}}", 'N', NULL},
    {"zero_optimization.stage", "{}", ZERO("\"stage\": 1"), 'C', NULL},
    {"zero_optimization.stage", "{}", ZERO("\"stage\": 2"), 'C', NULL},
    {"zero_optimization.stage", "{}", ZERO("\"stage\": 3"), 'C', NULL},
    {"zero_optimization.stage", "{}", ZERO("\"stage\": 0"), 'N', NULL},
    {"zero_optimization.reduce_bucket_size", "{}", ZERO("\"reduce_bucket_size\": 1e6"), 'C', NULL},
    {"zero_optimization.overlap_comm", "{}", ZERO("\"overlap_comm\": false"), 'R', NS},
    {"zero_optimization.overlap_comm", "{}", ZERO("\"overlap_comm\": true"), 'N', NULL},
    /* Every other key of the section configures ZeRO stages 1-3. */
    {"zero_optimization.allgather_bucket_size", "{}", ZERO("\"allgather_bucket_size\": 5e8"),
     'R', "is not supported: dtrain's ZeRO reads"},
    {"zero_optimization.allgather_partitions", "{}", ZERO("\"allgather_partitions\": true"), 'R',
     "is not supported: dtrain's ZeRO reads"},
    {"zero_optimization.reduce_scatter", "{}", ZERO("\"reduce_scatter\": true"), 'R',
     "is not supported: dtrain's ZeRO reads"},
    {"zero_optimization.contiguous_gradients", "{}", ZERO("\"contiguous_gradients\": true"), 'R',
     "is not supported: dtrain's ZeRO reads"},
    {"zero_optimization.offload_optimizer", "{}",
     ZERO("\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}"), 'C', NULL},
    {"zero_optimization.offload_optimizer", "{}",
     ZERO("\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\", "
          "\"buffer_count\": 5}"), 'C', NULL},
    {"zero_optimization.offload_optimizer", "{}",
     ZERO("\"offload_optimizer\": {\"device\": \"gpu\"}"), 'R', "one of none|cpu|nvme"},
    {"zero_optimization.offload_optimizer", "{}",
     ZERO("\"offload_optimizer\": {\"ratio\": 0.5}"), 'R', "is not a key dtrain reads"},
    {"zero_optimization.offload_param", "{}",
     ZERO("\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\"}, "
          "\"offload_param\": {\"device\": \"nvme\", \"pin_memory\": true}"), 'C', NULL},
    {"zero_optimization.offload_param", "{}",
     ZERO("\"stage\": 3, \"offload_param\": {\"device\": \"cpu\", \"buffer_count\": 5}"), 'R',
     "dtrain reads each piece into a buffer of its own"},
    {"zero_optimization.sub_group_size", "{}",
     ZERO("\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\"}, "
          "\"sub_group_size\": 1e6"), 'C', NULL},
    {"zero_optimization.zero_quantized_gradients", "{}",
     ZERO("\"stage\": 3, \"zero_quantized_gradients\": true"), 'C', NULL},
    {"zero_optimization.zero_hpz_partition_size", "{}",
     ZERO("\"stage\": 3, \"zero_hpz_partition_size\": 2"), 'C', NULL},
    {"zero_optimization.zero_quantized_weights", "{}",
     ZERO("\"stage\": 3, \"zero_quantized_weights\": true"), 'C', NULL},
    {"aio.block_size", "{}", "{\"aio\": {\"block_size\": 262144}}", 'C', NULL},
    {"aio.queue_depth", "{}", "{\"aio\": {\"queue_depth\": 4}}", 'C', NULL},
    {"aio.single_submit", "{}", "{\"aio\": {\"single_submit\": true}}", 'R', NS},
    {"aio.single_submit", "{}", "{\"aio\": {\"single_submit\": false}}", 'N', NULL},
    {"aio.overlap_events", "{}", "{\"aio\": {\"overlap_events\": false}}", 'R', NS},
    {"aio.overlap_events", "{}", "{\"aio\": {\"overlap_events\": true}}", 'N', NULL},
    {"aio.thread_count", "{}", "{\"aio\": {\"thread_count\": 4}}", 'R', NS},
    {"aio.thread_count", "{}", "{\"aio\": {\"thread_count\": 1}}", 'N', NULL},
    {"zero_optimization.stage3_max_live_parameters", "{}",
     ZERO("\"stage3_max_live_parameters\": 1e9"), 'C', NULL},
    {"zero_optimization.stage3_param_persistence_threshold", "{}",
     ZERO("\"stage3_param_persistence_threshold\": 1e5"), 'C', NULL},
    {"zero_optimization.stage3_prefetch_bucket_size", "{}",
     ZERO("\"stage3_prefetch_bucket_size\": 5e8"), 'C', NULL},

    /* The section turns on full recomputation; dtrain's own key wins. */
    {"activation_checkpointing", "{}", CKPT(""), 'C', NULL},
    {"activation_checkpointing", "{\"recompute\": \"selective\"}",
     "{\"recompute\": \"selective\", \"activation_checkpointing\": {}}", 'N', NULL},
    {"activation_checkpointing.partition_activations", "{}",
     CKPT("\"partition_activations\": true"), 'R', NS},
    {"activation_checkpointing.cpu_checkpointing", "{}", CKPT("\"cpu_checkpointing\": true"), 'R',
     NS},
    {"activation_checkpointing.contiguous_memory_optimization", "{}",
     CKPT("\"contiguous_memory_optimization\": true"), 'R', NS},
    {"activation_checkpointing.number_checkpoints", "{}", CKPT("\"number_checkpoints\": 4"), 'R',
     NS},
    /* dtrain's kernels are synchronous: either value is what it does. */
    {"activation_checkpointing.synchronize_checkpoint_boundary", CKPT(""),
     CKPT("\"synchronize_checkpoint_boundary\": true"), 'N', NULL},
    {"activation_checkpointing.synchronize_checkpoint_boundary", CKPT(""),
     CKPT("\"synchronize_checkpoint_boundary\": false"), 'N', NULL},
    {"activation_checkpointing.synchronize_checkpoint_boundary", CKPT(""),
     CKPT("\"synchronize_checkpoint_boundary\": 1"), 'R', "expected a boolean"},
    {"activation_checkpointing.profile", "{}", CKPT("\"profile\": true"), 'R', NS},
    {"activation_checkpointing.partition_activations", CKPT(""),
     CKPT("\"partition_activations\": false, \"cpu_checkpointing\": false, "
          "\"contiguous_memory_optimization\": false, \"number_checkpoints\": null, "
          "\"synchronize_checkpoint_boundary\": false, \"profile\": false"),
     'N', NULL},
};

/* Keys whose every value changes nothing, by design (the comment at the
 * row says why); all others need a 'C' or an 'R' row. */
static const char *const noop_by_design[] = {
    "optimizer.params.torch_adam", "activation_checkpointing.synchronize_checkpoint_boundary"};

static int load(dt_train_config *c, const char *text)
{
    write_json(text);
    dt_config_defaults(c);
    err[0] = 0;
    return dt_config_load_json(c, json_path, err, sizeof err);
}

static void check_ds_row(const ds_row *r)
{
    dt_train_config base, with;
    CHECK(load(&base, r->base) == 0, "%s: base %s refused: %s", r->key, r->base, err);
    int rc = load(&with, r->json);
    const char *last = strrchr(r->key, '.') ? strrchr(r->key, '.') + 1 : r->key;
    size_t fields = offsetof(dt_train_config, given);
    switch (r->expect) {
    case 'R':
        CHECK(rc == -1 && strstr(err, r->needle) && strstr(err, last) && strstr(err, json_path),
              "%s: %s: want refused with '%s' naming '%s' and the file, got %s", r->key, r->json,
              r->needle, last, rc ? err : "accepted");
        break;
    case 'C':
        CHECK(rc == 0, "%s: %s refused: %s", r->key, r->json, err);
        CHECK(rc || memcmp(&base, &with, fields) != 0,
              "%s: %s was accepted and changed nothing", r->key, r->json);
        break;
    default:
        CHECK(rc == 0, "%s: %s (a value that changes nothing) refused: %s", r->key, r->json, err);
        CHECK(rc || memcmp(&base, &with, fields) == 0, "%s: %s should change nothing, but did",
              r->key, r->json);
    }
}

static int by_design(const char *key)
{
    for (size_t i = 0; i < sizeof noop_by_design / sizeof noop_by_design[0]; i++)
        if (!strcmp(noop_by_design[i], key)) return 1;
    return 0;
}

static void test_every_deepspeed_key(void)
{
    size_t nrows = sizeof ds_rows / sizeof ds_rows[0];
    for (size_t r = 0; r < nrows; r++) check_ds_row(&ds_rows[r]);
    char buf[256];
    int nkeys = 0;
    for (const char *key; (key = dt_cfg_deepspeed_key(nkeys, buf, sizeof buf)); nkeys++) {
        int acts = 0, noop = 0;
        for (size_t r = 0; r < nrows; r++) {
            if (strcmp(ds_rows[r].key, key)) continue;
            acts += ds_rows[r].expect != 'N';
            noop += ds_rows[r].expect == 'N';
        }
        if (by_design(key))
            CHECK(noop > 0, "%s: no row shows its values change nothing", key);
        else
            CHECK(acts > 0, "DeepSpeed key %s has no row in test_config_audit.c that shows it "
                  "changes the configuration or is refused", key);
    }
    /* A sanity bound on the list itself (the sections above, the aliases). */
    CHECK(nkeys >= 30, "only %d DeepSpeed keys listed", nkeys);
}

/* ---- the ranks' agreement ---------------------------------------------- */

/* Every option says whether ranks must agree on it (config/agree.c): one
 * added without a rule would go unchecked across ranks by accident. */
static void test_every_option_has_an_agree_rule(void)
{
    for (int i = 0; i < dt_cfg_noptions; i++) {
        const dt_cfg_opt *o = &dt_cfg_options[i];
        int rule = dt_config_agree_rule(o->flag);
        if (o->type == T_ACTION)
            CHECK(rule == -1, "--%s is an action but has an agree rule", o->flag);
        else
            CHECK(rule >= 0, "--%s has no rule in config/agree.c: say whether the ranks of a "
                  "job must agree on it", o->flag);
    }
    const char *flag;
    for (int i = 0; (flag = dt_config_agree_flag(i)); i++) {
        int at = dt_cfg_find_flag(flag, strlen(flag));
        CHECK(at >= 0 && dt_cfg_options[at].type != T_ACTION,
              "config/agree.c has a rule for --%s, which is no option of the table", flag);
    }
    CHECK(dt_config_agree_rule("pp") == DT_AGREE_VALUE, "--pp must agree");
    CHECK(dt_config_agree_rule("no-such-option") == -1, "a rule for an unknown option");
}

int main(void)
{
    setenv("DTRAIN_LOG", "error", 1); /* warnings are test_config.c's subject */
    json_path_init("test_config_audit");
    test_every_option();
    test_every_deepspeed_key();
    test_every_option_has_an_agree_rule();
    remove(json_path);
    return finish("test_config_audit");
}
