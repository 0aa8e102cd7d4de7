/* Validation: every field against the table, the rules that join several
 * options, and the values inferred from the others (seq_len, min_lr, the
 * batch number not given). Also which ranks share the data (the
 * data-parallel size of each strategy). */
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/str.h"
#include "model/block.h"
#include "parallel/registry.h"
#include "train/config/internal.h"

/* Every field against the table's range and choices, named by its JSON key. */
static int check_fields(dt_train_config *c, char *err, size_t n)
{
    for (int i = 0; i < dt_cfg_noptions; i++) {
        const dt_cfg_opt *o = &dt_cfg_options[i];
        if (o->type == T_ACTION) continue;
        char who[40], canon[64];
        dt_strf(who, sizeof who, "%s", o->flag);
        for (char *p = who; *p; p++) *p = *p == '-' ? '_' : *p;
        dt_cfg_val v = dt_cfg_read_field(c, o);
        if (dt_cfg_check_range(o, who, &v, err, n)) return -1;
        if (o->type == T_CHOICE && dt_cfg_check_string(o, who, &v.s, canon, sizeof canon, err, n))
            return -1;
        if (o->type == T_CHOICE) memmove((char *)c + o->off, v.s, strlen(v.s) + 1);
        if (o->type == T_BOOL && v.i != 0 && v.i != 1)
            return dt_strf(err, n, "%s: %lld must be 0 or 1", who, v.i), -1;
    }
    return 0;
}

/* With --init or --resume the file gives the model's sizes, and the trainer
 * judges them once merged with the ones given here (resolve_model_config,
 * dt_gpt_config_check); judging the preset's sizes would refuse a file whose
 * width is not the preset's. So only sizes no file will replace are checked
 * here: all of them without a file, the explicitly given ones with one. */
static int check_model(dt_train_config *c, char *err, size_t n)
{
    int from_file = c->init[0] || c->resume_flag;
    int width = !from_file || (DT_CONFIG_GIVEN(c, n_embd) && DT_CONFIG_GIVEN(c, n_head));
    int block = !from_file || DT_CONFIG_GIVEN(c, block_size);
    dt_block blocks[DT_LAYER_MAX_BLOCKS];
    if (dt_blocks_parse(c->blocks, blocks, err, n) < 0) return -1;
    if (width && c->n_embd % c->n_head)
        return dt_strf(err, n, "n_embd = %d is not divisible by n_head = %d", c->n_embd,
                       c->n_head), -1;
    if (!c->seq_len) c->seq_len = c->block_size;
    if (block && c->seq_len > c->block_size)
        return dt_strf(err, n, "seq_len = %d exceeds block_size = %d", c->seq_len,
                       c->block_size), -1;
    return 0;
}

/* Mixture of experts: routing options need experts (from --num-experts,
 * or a file's router with --init or --resume), and what a layout cannot
 * split yet is refused. */
/* The Llama family's options need it (a file of the family brings it). */
static int check_arch(const dt_train_config *c, char *err, size_t n)
{
    static const size_t llama_only[] = {
        offsetof(dt_train_config, n_kv_head), offsetof(dt_train_config, ffn),
        offsetof(dt_train_config, rope_theta), offsetof(dt_train_config, norm_eps),
        offsetof(dt_train_config, tie)};
    const int llama = !strcmp(c->arch, "llama");
    for (size_t i = 0; !llama && i < sizeof llama_only / sizeof *llama_only; i++)
        if (dt_config_given_at(c, llama_only[i]) && !c->init[0] && !c->resume_flag)
            return dt_strf(err, n, "--%s is an option of the Llama family: add --arch llama",
                           dt_cfg_options[dt_cfg_opt_at(llama_only[i])].flag), -1;
    return 0;
}

static int check_moe(dt_train_config *c, char *err, size_t n)
{
    static const size_t moe_only[] = {
        offsetof(dt_train_config, moe_ffn),       offsetof(dt_train_config, moe_topk),
        offsetof(dt_train_config, moe_capacity),  offsetof(dt_train_config, moe_aux_coeff),
        offsetof(dt_train_config, moe_z_coeff),   offsetof(dt_train_config, moe_expert_bias),
        offsetof(dt_train_config, moe_bias_rate), offsetof(dt_train_config, moe_log_load),
        offsetof(dt_train_config, moe_force_balance)};
    const int from_file = c->init[0] || c->resume_flag;
    for (size_t i = 0; !c->num_experts && !from_file && i < sizeof moe_only / sizeof *moe_only;
         i++)
        if (dt_config_given_at(c, moe_only[i]))
            return dt_strf(err, n, "--%s applies to a mixture of experts: add --num-experts E",
                           dt_cfg_options[dt_cfg_opt_at(moe_only[i])].flag), -1;
    if (DT_CONFIG_GIVEN(c, moe_capacity) && c->moe_capacity <= 0)
        return dt_strf(err, n, "--moe-expert-capacity-factor %g: a capacity factor above 0 caps "
                       "each expert at CF T K / E tokens a sequence (1.0 is an even share); "
                       "leave it out for dropless routing", c->moe_capacity), -1;
    if (DT_CONFIG_GIVEN(c, moe_bias_rate) && !c->moe_expert_bias)
        return dt_strf(err, n, "--moe-router-bias-update-rate moves the experts' bias: add "
                       "--moe-router-enable-expert-bias"), -1;
    if (c->num_experts && c->moe_topk > c->num_experts)
        return dt_strf(err, n, "--moe-router-topk %d with --num-experts %d: a token goes to K "
                       "of the E experts, so K <= %d", c->moe_topk, c->num_experts,
                       c->num_experts), -1;
    if (c->num_experts && strcmp(c->strategy, "ddp"))
        return dt_strf(err, n, "--num-experts with --strategy %s: a mixture of experts trains "
                       "with --strategy ddp (data parallelism, ZeRO, --pp)", c->strategy), -1;
    if (c->ep > 1 && !c->num_experts && !from_file)
        return dt_strf(err, n, "--expert-model-parallel-size %d splits a mixture of experts' "
                       "experts over ranks: add --num-experts E", c->ep), -1;
    const dt_arch *family = dt_arch_find(c->arch);
    if (c->num_experts && !c->blocks[0] && family && family->moe_blocks)
        dt_strf(c->blocks, sizeof c->blocks, "%s", family->moe_blocks);
    return 0;
}

void dt_config_family(const dt_train_config *c, dt_gpt_config *out)
{
    if (strcmp(c->arch, "llama")) return;
    out->arch = DT_ARCH_LLAMA;
    out->n_kv_head = c->n_kv_head;
    out->ffn = c->ffn;
    out->rope_theta = c->rope_theta;
    out->norm_eps = c->norm_eps;
    out->tie = c->tie;
    if (!out->blocks[0]) dt_strf(out->blocks, sizeof out->blocks, "%s", dt_gpt_blocks(out));
}

void dt_config_moe(const dt_train_config *c, int experts, int ffn, dt_moe_config *out)
{
    *out = (dt_moe_config){.experts = experts,
                           .ffn = ffn,
                           .topk = c->moe_topk,
                           .capacity = c->moe_capacity,
                           .aux_coeff = c->moe_aux_coeff,
                           .z_coeff = c->moe_z_coeff,
                           .expert_bias = c->moe_expert_bias,
                           .bias_rate = c->moe_bias_rate,
                           .force_balance = c->moe_force_balance};
}

static int check_optim(dt_train_config *c, char *err, size_t n)
{
    if (c->given[DT_CFG_IDX(min_lr_ratio)]) c->min_lr = c->min_lr_ratio * c->lr;
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
    if ((double)micro * (double)accum * dp > DT_CFG_LMAX)
        return dt_strf(err, n, "batch_size %lld x grad_accum %lld x data-parallel size %d is "
                       "too large", micro, accum, dp), -1;
    long long per_step = micro * accum * dp;
    int micro_given = DT_CONFIG_GIVEN(c, batch_size), accum_given = DT_CONFIG_GIVEN(c, grad_accum);
    if (!DT_CONFIG_GIVEN(c, train_batch_size) || c->train_batch_size == 0) {
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

/* Whether the run has data to evaluate on: its own file, the built-in
 * corpus's, or a held-out tail of --data. */
static int has_validation(const dt_train_config *c)
{
    return c->val_data[0] || !c->data[0] || c->val_fraction > 0;
}

/* Options that only act with others: given without them, they would be
 * accepted and do nothing. */
/* Mixed precision lives in the model and the strategies that reduce
 * gradients (DDP, ZeRO); naive DP and the parameter server move fp32. */
static int check_precision(const dt_train_config *c, char *err, size_t n)
{
    int bf16 = !strcmp(c->dtype, "bf16"), ddp = !strcmp(c->strategy, "ddp");
    if (bf16 && (!strcmp(c->strategy, "dp") || !strcmp(c->strategy, "ps")))
        return dt_strf(err, n, "--dtype bf16 (mixed precision: bf16 weights, fp32 master "
                       "weights) runs with --strategy ddp, with or without --zero-stage; "
                       "--strategy %s trains in fp32", c->strategy), -1;
    if (!bf16 && !strcmp(c->grad_accum_dtype, "bf16"))
        return dt_strf(err, n, "--grad-accum-dtype bf16 keeps mixed precision's gradients in "
                       "bf16; it needs --dtype bf16 (fp32 training accumulates in fp32)"), -1;
    if (DT_CONFIG_GIVEN(c, comm_dtype) && !ddp)
        return dt_strf(err, n, "--comm-dtype sets how --strategy ddp (and ZeRO) reduce "
                       "gradients; --strategy %s moves them in fp32", c->strategy), -1;
    if (DT_CONFIG_GIVEN(c, save_dtype) && !c->save_final[0])
        return dt_strf(err, n, "--save-dtype %s sets how --save-final stores the final "
                       "weights; add --save-final FILE|DIR/ (checkpoints in --out stay fp32)",
                       c->save_dtype), -1;
    return 0;
}

/* The pipeline's settings mean nothing without stages, and what a
 * pipeline run cannot do yet is refused rather than done wrong. */
static int check_pipeline(const dt_train_config *c, char *err, size_t n)
{
    static const size_t pp_only[] = {offsetof(dt_train_config, pp_schedule),
                                     offsetof(dt_train_config, pp_partition),
                                     offsetof(dt_train_config, pp_virtual)};
    for (size_t i = 0; c->pp == 1 && i < sizeof pp_only / sizeof pp_only[0]; i++)
        if (dt_config_given_at(c, pp_only[i]))
            return dt_strf(err, n, "--%s applies to a pipeline: add --pp 2 or more (stages)",
                           dt_cfg_options[dt_cfg_opt_at(pp_only[i])].flag), -1;
    if (c->tp > 1 && strcmp(c->strategy, "ddp") != 0)
        return dt_strf(err, n, "--tp %d splits the model over the ranks of --strategy ddp "
                       "(with data parallelism over equal slices); --strategy %s cannot split "
                       "it", c->tp, c->strategy), -1;
    if (c->dp > 0 && strcmp(c->strategy, "ddp") != 0)
        return dt_strf(err, n, "--dp sets the data-parallel size of --strategy ddp (beside "
                       "--tp, --cp and --pp); --strategy %s sizes its groups itself",
                       c->strategy), -1;
    if (c->cp > 1 && strcmp(c->strategy, "ddp") != 0)
        return dt_strf(err, n, "--cp %d splits the sequences over the ranks of --strategy ddp "
                       "(with data parallelism over the rest); --strategy %s cannot split them",
                       c->cp, c->strategy), -1;
    if (c->sequence_parallel && c->tp == 1)
        return dt_strf(err, n, "--sequence-parallel splits the LayerNorm and residual rows over "
                       "a tensor-parallel group: add --tp 2 or more"), -1;
    if (c->cp == 1 && dt_config_given_at(c, offsetof(dt_train_config, cp_algo)))
        return dt_strf(err, n, "--cp-algo applies to context parallelism: add --cp 2 or more "
                       "(ranks per sequence)"), -1;
    if (c->pp == 1) return 0;
    if (strcmp(c->strategy, "ddp") != 0)
        return dt_strf(err, n, "--pp %d splits the model over the ranks of --strategy ddp "
                       "(with data parallelism within each stage); --strategy %s cannot hold "
                       "stages", c->pp, c->strategy), -1;
    return 0;
}

static int check_run(const dt_train_config *c, int dp, char *err, size_t n)
{
    if (c->resume_flag && !c->resume[0] && !c->out_dir[0])
        return dt_strf(err, n, "resume: --resume without a directory needs --out "
                       "(or give --resume=DIR)"), -1;
    if (c->save_every > 0 && !c->out_dir[0])
        return dt_strf(err, n, "save_every = %ld needs --out DIR", c->save_every), -1;
    if (DT_CONFIG_GIVEN(c, keep_last) && !c->out_dir[0])
        return dt_strf(err, n, "keep_last = %ld needs --out DIR (it counts the checkpoints "
                       "kept there)", c->keep_last), -1;
    if (DT_CONFIG_GIVEN(c, val_fraction) && (!c->data[0] || c->val_data[0]))
        return dt_strf(err, n, "val_fraction = %g holds out the tail of --data; %s",
                       c->val_fraction, c->val_data[0] ? "--val-data is given instead"
                       : "the built-in corpus has its own validation text (give --data)"), -1;
    if ((DT_CONFIG_GIVEN(c, eval_every) && c->eval_every > 0) ||
        (DT_CONFIG_GIVEN(c, eval_batches) && c->eval_batches > 0)) {
        if (c->eval_batches == 0)
            return dt_strf(err, n, "eval_every = %ld needs eval_batches > 0", c->eval_every), -1;
        if (!has_validation(c))
            return dt_strf(err, n, "evaluation needs validation data: --val-data, or "
                           "--val-fraction above 0"), -1;
    }
    /* One optimizer's settings given with another would do nothing. */
    int sgd = !strcmp(c->optimizer, "sgd");
    if (!sgd && DT_CONFIG_GIVEN(c, momentum))
        return dt_strf(err, n, "momentum = %g applies to --optimizer sgd; %s has --beta1",
                       c->momentum, c->optimizer), -1;
    static const struct { size_t off; const char *name; } adam_only[] = {
        {offsetof(dt_train_config, beta1), "beta1"},
        {offsetof(dt_train_config, beta2), "beta2"},
        {offsetof(dt_train_config, eps), "eps"},
    };
    for (size_t i = 0; sgd && i < sizeof adam_only / sizeof adam_only[0]; i++)
        if (dt_config_given_at(c, adam_only[i].off))
            return dt_strf(err, n, "%s applies to --optimizer adam and adamw, not sgd "
                           "(sgd has --momentum)", adam_only[i].name), -1;
    if (!strcmp(c->lr_schedule, "constant") &&
        (DT_CONFIG_GIVEN(c, min_lr) || DT_CONFIG_GIVEN(c, min_lr_ratio)))
        return dt_strf(err, n, "min_lr is the floor a decaying schedule ends at; --lr-schedule "
                       "constant stays at --lr (choose cosine or linear, or drop min_lr)"), -1;
    /* With dp each device is a thread running its own compute threads. */
    long per_device = c->threads, devices = !strcmp(c->strategy, "dp") ? dp : 1;
    if (per_device * devices > DT_CFG_MAX_THREADS)
        return dt_strf(err, n, "threads = %ld on each of %ld devices is %ld threads in one "
                       "process, above %d: lower --threads (0 shares the online cores)",
                       per_device, devices, per_device * devices, DT_CFG_MAX_THREADS), -1;
    return dt_cfg_check_zero(c, err, n) || check_precision(c, err, n) ||
                   check_pipeline(c, err, n) ? -1 : 0;
}

int dt_config_validate(dt_train_config *c, int data_parallel_size, char *err, size_t errlen)
{
    if (data_parallel_size < 1)
        return dt_strf(err, errlen, "data-parallel size %d must be >= 1", data_parallel_size), -1;
    if (check_fields(c, err, errlen) || check_arch(c, err, errlen) || check_moe(c, err, errlen) ||
        check_model(c, err, errlen) ||
        check_optim(c, err, errlen) || check_batch(c, data_parallel_size, err, errlen) ||
        check_run(c, data_parallel_size, err, errlen))
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
        {offsetof(dt_train_config, fixed_staleness), 2},
        {offsetof(dt_train_config, compress), 2}, {offsetof(dt_train_config, bucket_mb), 0},
    };
    static const char *const names[] = {"ddp", "dp", "ps"};
    int mine = dp ? 1 : ps ? 2 : 0;
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) {
        int idx = dt_cfg_opt_at(owned[i].off);
        if (c->given[idx] && owned[i].strategy != mine)
            return dt_strf(err, n, "--%s applies to --strategy %s, not %s",
                           dt_cfg_options[idx].flag, names[owned[i].strategy], c->strategy), -1;
    }
    if (!dp && !ps && world == 1 && DT_CONFIG_GIVEN(c, bucket_mb))
        DT_WARN("bucket_mb = %g: one process exchanges no gradients, so it has no effect "
                "(it sizes DDP's buckets when --nproc is above 1)", c->bucket_mb);
    if (!dp && !ps && world == 1 && c->zero_stage > 0)
        DT_WARN("zero_stage = %d in one process: over 1 rank ZeRO shards nothing, so this "
                "run holds what DDP would (it shards over the ranks of --nproc N)", c->zero_stage);
    if (ps && DT_CONFIG_GIVEN(c, staleness) && strcmp(c->ps_mode, "async"))
        return dt_strf(err, n, "--staleness applies to --ps-mode async"), -1;
    if (ps && c->fixed_staleness && strcmp(c->ps_mode, "async"))
        return dt_strf(err, n, "--fixed-staleness applies to --ps-mode async (a synchronous "
                       "run is reproducible already)"), -1;
    /* Step t computes on the parameters after step t - K: the last one too
     * would see the starting ones. */
    if (ps && c->fixed_staleness && c->staleness > 0 && c->staleness >= c->steps - 1)
        return dt_strf(err, n, "--staleness %d with --fixed-staleness: each of the %ld steps "
                       "would compute on the starting parameters; give a staleness of at "
                       "most %ld", c->staleness, c->steps, c->steps > 2 ? c->steps - 2 : 0), -1;
    /* The strategy itself says how it splits the batch, and which jobs it
     * cannot run. */
    const dt_strategy_kind *kind = dt_strategy_find(c->strategy);
    if (!kind) return dt_strf(err, n, "--strategy %s: no such strategy", c->strategy), -1;
    dt_parallel_opts o = dt_config_parallel_opts(c);
    if (kind->data_parallel_size(&o, world, dp_size, err, n)) return -1;
    if (c->pp > 1 && *dp_size == 1 && c->zero_stage > 0)
        DT_WARN("zero_stage = %d with --pp %d over %d ranks: each stage has 1 data-parallel "
                "rank, over which ZeRO shards nothing (it splits a stage's optimizer state over "
                "its data-parallel ranks: start --nproc %d or more)", c->zero_stage, c->pp, world,
                2 * c->pp);
    return 0;
}

dt_parallel_opts dt_config_parallel_opts(const dt_train_config *c)
{
    int bf16_wire = !strcmp(c->comm_dtype, "bf16") ||
                    (!strcmp(c->comm_dtype, "auto") && !strcmp(c->dtype, "bf16"));
    return (dt_parallel_opts){.bucket_bytes = (size_t)(c->bucket_mb * 1048576.0),
                              .grad_wire = bf16_wire ? DT_BF16 : DT_F32,
                              .zero = {.stage = c->zero_stage,
                                       .prefetch = c->zero_prefetch,
                                       .prefetch_floats = (size_t)c->zero_prefetch_elems,
                                       .reshard_after_forward = c->zero_reshard,
                                       .persist_floats = (size_t)c->zero_persist,
                                       .max_live_floats = (size_t)c->zero_max_live,
                                       .quant_weights = c->zero_qwz,
                                       .quant_block = c->zero_quant_block,
                                       .offload_params = !strcmp(c->offload_param, "nvme"),
                                       .hpz = c->zero_hpz,
                                       .quant_grads = c->zero_qgz,
                                       .grad_bits = c->zero_qgz_bits,
                                       .defer_update = c->offload_overlap &&
                                                       !strcmp(c->offload_optimizer, "nvme")},
                              .devices = c->devices,
                              .servers = c->servers,
                              .ps_async = strcmp(c->ps_mode, "async") == 0,
                              .staleness = c->staleness,
                              .fixed_staleness = c->fixed_staleness,
                              .compress = c->compress,
                              .optimizer = c->optimizer,
                              .pp = c->pp,
                              .dp = c->dp,
                              .tp = c->tp,
                              .cp = c->cp,
                              .ep = c->ep,
                              .sp = c->sequence_parallel,
                              .cp_algo = c->cp_algo,
                              .accum = c->grad_accum,
                              /* interleaved without --pp-virtual: two
                               * chunks a rank, its smallest real case */
                              .pp_virtual = !strcmp(c->pp_schedule, "interleaved") &&
                                                    !DT_CONFIG_GIVEN(c, pp_virtual)
                                                ? 2 : c->pp_virtual,
                              .pp_schedule = c->pp_schedule,
                              .pp_partition = c->pp_partition};
}
