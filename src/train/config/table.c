/* The option table: every option of `dtrain train` once, with the presets
 * and defaults, the hooks that run when an option is set, and lookups by
 * field, flag and JSON key. See config/internal.h. */
#include <math.h>
#include <string.h>

#include "comm/bootstrap/bootstrap.h"
#include "core/str.h"
#include "dtrain/comm.h"
#include "parallel/compress.h"
#include "parallel/registry.h"
#include "train/config/internal.h"

static int hook_model(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_min_lr(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_min_lr_ratio(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_resume(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_compress(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_comm_algo(dt_train_config *c, const char *who, char *err, size_t n);
static int hook_strategy(dt_train_config *c, const char *who, char *err, size_t n);

#define FIELD(f) offsetof(dt_train_config, f), sizeof(((dt_train_config *)0)->f)
#define IMAX DT_CFG_IMAX
#define LMAX DT_CFG_LMAX
#define OPT(g, flag, alias, type, f, lo, hi, meta, hook, fl, help) \
    {flag, alias, type, FIELD(f), lo, hi, meta, hook, fl, g, help, NULL}
#define ACT(g, flag, meta, fl, help) \
    {flag, NULL, T_ACTION, 0, 0, 0, 0, meta, NULL, fl, g, help, NULL}
/* A number in a help text, from the constant that bounds it. */
#define NUM_(x) #x
#define NUM(x) NUM_(x)

const char *const dt_cfg_group_titles[G_COUNT] = {
    "Model", "Data", "Batch", "Optimizer and schedule", "Run",
    "Evaluation and checkpoints", "Logging", "Other"};

const dt_cfg_opt dt_cfg_options[] = {
    OPT(G_MODEL, "model", NULL, T_CHOICE, model, 0, 0,
        "tiny|gpt2|gpt2-medium|gpt2-large|gpt2-xl|bench|mixtral-mini|deepseek-moe-mini|"
        "llama3-1b|llama3-8b|llama3-70b|llama3-405b|mixtral-8x7b",
        hook_model, O_EMPTYOK,
        "preset; sets the sizes not given explicitly (\"\" = none)"),
    OPT(G_MODEL, "arch", NULL, T_CHOICE, arch, 0, 0, "gpt2|llama", NULL, 0,
        "model family (llama: RMSNorm, rotary, SwiGLU, GQA, untied head)"),
    OPT(G_MODEL, "n-layer", NULL, T_INT, n_layer, 1, IMAX, "N", NULL, 0, "transformer blocks"),
    OPT(G_MODEL, "n-head", NULL, T_INT, n_head, 1, IMAX, "N", NULL, 0, "attention heads"),
    OPT(G_MODEL, "n-embd", NULL, T_INT, n_embd, 1, IMAX, "N", NULL, 0,
        "embedding width, a multiple of --n-head"),
    OPT(G_MODEL, "n-kv-head", NULL, T_INT, n_kv_head, 0, IMAX, "N", NULL, 0,
        "llama: key/value heads (grouped-query attention); 0 = --n-head"),
    OPT(G_MODEL, "ffn-hidden-size", NULL, T_INT, ffn, 0, IMAX, "F", NULL, 0,
        "llama: SwiGLU's hidden width; 0 = 8 C / 3 rounded up to 256"),
    OPT(G_MODEL, "rope-theta", NULL, T_DBL, rope_theta, 1, 1e12, "X", NULL, 0,
        "llama: rotary embeddings' base"),
    OPT(G_MODEL, "norm-eps", NULL, T_DBL, norm_eps, 1e-12, 1, "X", NULL, 0,
        "llama: RMSNorm's epsilon"),
    OPT(G_MODEL, "tie-word-embeddings", NULL, T_BOOL, tie, 0, 1, "[=0|1]", NULL, O_OPTVAL,
        "llama: the output head is the embedding (GPT-2's always is)"),
    OPT(G_MODEL, "vocab-size", NULL, T_INT, vocab_size, 0, IMAX, "N", NULL, 0,
        "vocabulary; 0 = from --init or the data"),
    OPT(G_MODEL, "block-size", NULL, T_INT, block_size, 1, IMAX, "N", NULL, 0,
        "context length (position embeddings)"),
    OPT(G_MODEL, "blocks", NULL, T_STR, blocks, 0, 0, "SPEC", NULL, 0,
        "a layer's blocks as name:kind, a norm then its branch; \"\" = GPT-2's"),
    OPT(G_MODEL, "num-experts", NULL, T_INT, num_experts, 0, DT_MOE_MAX_EXPERTS, "E", NULL, 0,
        "mixture of experts: E experts replace each layer's MLP; 0 = dense"),
    OPT(G_MODEL, "moe-ffn-hidden-size", NULL, T_INT, moe_ffn, 0, IMAX, "F", NULL, 0,
        "each expert's hidden width; 0 = 4 x --n-embd"),
    OPT(G_MODEL, "moe-router-topk", NULL, T_INT, moe_topk, 1, DT_MOE_MAX_EXPERTS, "K", NULL, 0,
        "experts per token, weights renormalized to sum to 1"),
    OPT(G_MODEL, "moe-expert-capacity-factor", NULL, T_DBL, moe_capacity, 0, 1e6, "CF", NULL,
        0, "tokens an expert takes per sequence: CF T K / E; 0 = dropless"),
    OPT(G_MODEL, "moe-aux-loss-coeff", NULL, T_DBL, moe_aux_coeff, 0, 1e6, "X", NULL, 0,
        "sequence-wise load-balancing loss's weight"),
    OPT(G_MODEL, "moe-z-loss-coeff", NULL, T_DBL, moe_z_coeff, 0, 1e6, "X", NULL, 0,
        "router z-loss's weight (mean logsumexp^2)"),
    OPT(G_MODEL, "moe-router-enable-expert-bias", NULL, T_BOOL, moe_expert_bias, 0, 1,
        "[=0|1]", NULL, O_OPTVAL, "aux-loss-free balance: a bias per expert on the choice"),
    OPT(G_MODEL, "moe-router-bias-update-rate", NULL, T_DBL, moe_bias_rate, 0, 1e6, "X", NULL,
        0, "how far each step moves an expert's bias toward equal load"),
    OPT(G_MODEL, "moe-router-force-load-balancing", NULL, T_BOOL, moe_force_balance, 0, 1,
        "[=0|1]", NULL, O_OPTVAL, "benchmarks: route each position by a hash, evenly"),
    OPT(G_LOG, "moe-per-layer-logging", NULL, T_BOOL, moe_log_load, 0, 1, "[=0|1]", NULL,
        O_OPTVAL, "print each moe layer's load (tokens per expert, dropped)"),
    OPT(G_MODEL, "init", NULL, T_STR, init, 0, 0, "FILE|DIR", NULL, 0,
        "start from weights: safetensors or a Hugging Face model directory"),
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
        "bf16: mixed precision (bf16 weights, fp32 master weights)"),
    OPT(G_RUN, "comm-dtype", "communication_data_type", T_CHOICE, comm_dtype, 0, 0,
        "auto|fp32|bf16", NULL, 0, "gradients reduced in this type; auto = --dtype"),
    OPT(G_RUN, "grad-accum-dtype", NULL, T_CHOICE, grad_accum_dtype, 0, 0, "fp32|bf16",
        NULL, 0, "gradients accumulate in this type (bf16 needs --dtype bf16)"),
    OPT(G_RUN, "recompute", NULL, T_CHOICE, recompute, 0, 0, "none|selective|full", NULL, 0,
        "activations rebuilt in backward (less memory, same numbers)"),
    {"threads", NULL, T_INT, FIELD(threads), 0, DT_CFG_MAX_THREADS, "N", NULL, 0, G_RUN,
     "compute threads per rank, at most 1024; 0 = all online cores",
     "more threads than cores only slow a rank down (0 takes one per online core), and "
     "OpenMP cannot start thousands"},
    OPT(G_RUN, "seed", NULL, T_U64, seed, 0, 0, "N", NULL, 0, "seed of init and shuffling"),
    OPT(G_RUN, "zero-stage", NULL, T_INT, zero_stage, 0, 3, "N", NULL, 0,
        "ZeRO over ddp: 1 optimizer, 2 +grads, 3 +params (FSDP)"),
    OPT(G_RUN, "zero-prefetch", NULL, T_INT, zero_prefetch, 0, 1024, "N", NULL, 0,
        "ZeRO-3: layers gathered ahead of the one computing"),
    OPT(G_RUN, "zero-reshard-after-forward", NULL, T_INT, zero_reshard, 0, 1, "0|1", NULL, 0,
        "ZeRO-3: 0 keeps layers gathered for backward"),
    OPT(G_RUN, "zero-prefetch-elems", NULL, T_DBL, zero_prefetch_elems, 0, 1e15, "ELEMS", NULL,
        0, "ZeRO-3: prefetch up to this many parameters"),
    OPT(G_RUN, "zero-quantized-weights", NULL, T_BOOL, zero_qwz, 0, 1, "[=0|1]", NULL, O_OPTVAL,
        "ZeRO++ qwZ: stage 3 gathers parameters as int8 blocks"),
    OPT(G_RUN, "zero-quantized-gradients", NULL, T_BOOL, zero_qgz, 0, 1, "[=0|1]", NULL,
        O_OPTVAL, "ZeRO++ qgZ: quantized gradient reduce-scatter (all-to-alls)"),
    OPT(G_RUN, "zero-qgz-bits", NULL, T_INT, zero_qgz_bits, 4, 8, "8|4", NULL, 0,
        "qgZ: bits a gradient value (DeepSpeed's qgZ sends 4)"),
    OPT(G_RUN, "zero-quant-block", NULL, T_INT, zero_quant_block, 16, 1 << 20, "N", NULL, 0,
        "qwZ, qgZ: values per fp32 scale"),
    OPT(G_RUN, "zero-hpz-partition-size", NULL, T_INT, zero_hpz, 1, 1 << 16, "K", NULL, 0,
        "ZeRO++ hpZ: 2nd parameter copy over K ranks (a host)"),
    OPT(G_RUN, "offload-optimizer", NULL, T_CHOICE, offload_optimizer, 0, 0, "none|cpu|nvme",
        NULL, 0, "ZeRO-Infinity: optimizer state in memory, or in a file"),
    OPT(G_RUN, "offload-param", NULL, T_CHOICE, offload_param, 0, 0, "none|cpu|nvme", NULL, 0,
        "ZeRO-Infinity: stage 3's parameter pieces in memory, or a file"),
    OPT(G_RUN, "offload-overlap", NULL, T_BOOL, offload_overlap, 0, 1, "[=0|1]", NULL, O_OPTVAL,
        "ZeRO-3 nvme: each update deferred into its layer's next gather"),
    OPT(G_RUN, "nvme-path", NULL, T_STR, nvme_path, 0, 0, "DIR", NULL, 0,
        "directory of nvme offload's files"),
    OPT(G_RUN, "offload-buffers", NULL, T_INT, offload_buffers, 3, 16, "N", NULL, 0,
        "nvme offload: chunk buffers (reads ahead N - 2 chunks)"),
    OPT(G_RUN, "sub-group-size", NULL, T_DBL, sub_group_size, 1024, 1e12, "ELEMS", NULL, 0,
        "nvme offload: elements per streamed chunk of a state"),
    OPT(G_RUN, "aio-block-size", NULL, T_LONG, aio_block_size, 4096, 1L << 30, "BYTES", NULL, 0,
        "nvme offload: bytes per I/O request (a multiple of 4096)"),
    OPT(G_RUN, "aio-queue-depth", NULL, T_INT, aio_queue_depth, 1, 1024, "N", NULL, 0,
        "nvme offload: I/O requests in flight"),
    OPT(G_RUN, "zero-max-live", NULL, T_DBL, zero_max_live, 0, 1e15, "ELEMS", NULL, 0,
        "ZeRO-3: most parameters gathered; 0 = no limit"),
    OPT(G_RUN, "zero-persist", NULL, T_DBL, zero_persist, 0, 1e15, "ELEMS", NULL, 0,
        "ZeRO-3: layers of at most this many parameters stay gathered"),
    ACT(G_RUN, "nproc", "N", 0,
        "ranks to start here via `dtrain launch` (1 to " NUM(DT_MAX_LOCAL_RANKS)
        "), or the job's size"),
    ACT(G_RUN, "max-restarts", "K", 0,
        "with --nproc: start the ranks again after a failure, up to K times"),
    ACT(G_RUN, "min-nproc", "MIN", 0,
        "a rank lost for good: go on with down to MIN ranks (DDP, ZeRO-1/2)"),
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
    OPT(G_RUN, "fixed-staleness", NULL, T_BOOL, fixed_staleness, 0, 1, "[=0|1]", NULL, O_OPTVAL,
        "ps async: pushes in fixed order, each --staleness steps late"),
    OPT(G_RUN, "compress", NULL, T_STR, compress, 0, 0, "none|topk:R|int8", hook_compress, 0,
        "ps: compress pushes (error feedback)"),
    OPT(G_RUN, "comm-algo", NULL, T_STR, comm_algo, 0, 0, "COLL=ALGO,...", hook_comm_algo, 0,
        "force collective algorithms (default auto: cost model)"),
    OPT(G_RUN, "pp", NULL, T_INT, pp, 1, 64, "N", NULL, 0,
        "pipeline stages (consecutive layers); ranks = tp x cp x dp x pp"),
    OPT(G_RUN, "tp", NULL, T_INT, tp, 1, 64, "N", NULL, 0,
        "tensor parallel ranks: each holds a slice of every matrix"),
    OPT(G_RUN, "dp", NULL, T_INT, dp, 0, 65536, "N", NULL, 0,
        "data-parallel size with --tp/--cp/--pp; 0 = ranks / (tp cp pp)"),
    OPT(G_RUN, "sequence-parallel", NULL, T_BOOL, sequence_parallel, 0, 1, "[=0|1]", NULL,
        O_OPTVAL, "with --tp: LayerNorm and residual rows split over the tp group"),
    OPT(G_RUN, "cp", NULL, T_INT, cp, 1, 64, "N", NULL, 0,
        "context parallel ranks: each runs its part of every sequence"),
    OPT(G_RUN, "ep", NULL, T_INT, ep, 1, DT_MOE_MAX_EXPERTS, "N", NULL, 0,
        "expert parallel ranks (of the dp ones): each holds E / N experts"),
    OPT(G_RUN, "cp-algo", NULL, T_CHOICE, cp_algo, 0, 0, "ring|ulysses", NULL, 0,
        "attention across the cp group: k/v round a ring, or to heads"),
    OPT(G_RUN, "pp-schedule", NULL, T_CHOICE, pp_schedule, 0, 0,
        "naive|gpipe|1f1b|interleaved|zb1p", NULL, 0, "pipeline schedule (--grad-accum micro-batches)"),
    OPT(G_RUN, "pp-partition", NULL, T_CHOICE, pp_partition, 0, 0, "uniform|params|cost", NULL,
        0, "layers per stage: equal counts, parameters or measured time"),
    OPT(G_RUN, "pp-virtual", NULL, T_INT, pp_virtual, 1, 64, "V", NULL, 0,
        "interleaved: model chunks per rank"),
    OPT(G_LOG, "profile", NULL, T_BOOL, profile, 0, 1, "[=0|1]", NULL, O_OPTVAL,
        "time each part of a step against its roofline bound"),
    OPT(G_LOG, "trace", NULL, T_STR, trace, 0, 0, "FILE", NULL, 0,
        "write a Chrome/Perfetto timeline of every rank (Trace Event JSON)"),
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
    OPT(G_CKPT, "snapshot-every", NULL, T_LONG, snapshot_every, 0, LMAX, "N", NULL, 0,
        "steps between in-memory snapshots (with --max-restarts); 0 = none"),
    OPT(G_CKPT, "resume", NULL, T_STR, resume, 0, 0, "[=DIR]", hook_resume, O_OPTVAL,
        "resume from DIR; bare: the latest in --out"),
    OPT(G_CKPT, "save-final", NULL, T_STR, save_final, 0, 0, "FILE|DIR/", NULL, 0,
        "write the final weights (DIR/: a Hugging Face model directory)"),
    OPT(G_CKPT, "save-dtype", NULL, T_CHOICE, save_dtype, 0, 0, "fp32|bf16|fp16", NULL, 0,
        "--save-final's values stored as (checkpoints: fp32)"),
    OPT(G_LOG, "print-every", "steps_per_print", T_LONG, print_every, 1, LMAX, "N", NULL, 0,
        "steps between log lines"),
    OPT(G_LOG, "log-ranks", NULL, T_CHOICE, log_ranks, 0, 0, "0|all", NULL, 0,
        "ranks that print (all: each its own lines)"),
    OPT(G_LOG, "log-json", NULL, T_STR, log_json, 0, 0, "FILE", NULL, 0,
        "one JSON object per step (- = stdout)"),
    ACT(G_MISC, "config", "FILE", 0, "JSON config, read before all other flags"),
    ACT(G_MISC, "dry-run", "", O_NOVAL,
        "print the memory per rank by ZeRO's formulas; train nothing"),
    ACT(G_MISC, "help", "", O_NOVAL, "print this text (also -h)"),
};

const int dt_cfg_noptions = (int)(sizeof dt_cfg_options / sizeof dt_cfg_options[0]);
_Static_assert(sizeof dt_cfg_options / sizeof dt_cfg_options[0] <= DT_CONFIG_MAX_OPTIONS,
               "raise DT_CONFIG_MAX_OPTIONS in config/config.h");

/* ---- lookups ------------------------------------------------------------- */

int dt_cfg_opt_at(size_t off)
{
    for (int i = 0; i < dt_cfg_noptions; i++)
        if (dt_cfg_options[i].type != T_ACTION && dt_cfg_options[i].off == off) return i;
    return -1;
}

int dt_config_given_at(const dt_train_config *c, size_t field_offset)
{
    int i = dt_cfg_opt_at(field_offset);
    return i >= 0 && c->given[i];
}

/* Megatron-LM's names for the mesh's sizes, so that its launch lines work
 * as they are. */
static const struct {
    const char *megatron, *flag;
} megatron_flags[] = {
    {"tensor-model-parallel-size", "tp"},
    {"pipeline-model-parallel-size", "pp"},
    {"context-parallel-size", "cp"},
    {"expert-model-parallel-size", "ep"},
    {"num-query-groups", "n-kv-head"},
    {"rotary-base", "rope-theta"},
    {"virtual-pipeline-model-parallel-size", "pp-virtual"},
};

static int flag_index(const char *name, size_t len)
{
    for (int i = 0; i < dt_cfg_noptions; i++)
        if (strlen(dt_cfg_options[i].flag) == len && !strncmp(dt_cfg_options[i].flag, name, len))
            return i;
    return -1;
}

int dt_cfg_find_flag(const char *name, size_t len)
{
    int i = flag_index(name, len);
    for (size_t k = 0; i < 0 && k < sizeof megatron_flags / sizeof megatron_flags[0]; k++)
        if (strlen(megatron_flags[k].megatron) == len &&
            !strncmp(megatron_flags[k].megatron, name, len))
            i = flag_index(megatron_flags[k].flag, strlen(megatron_flags[k].flag));
    return i;
}

/* The JSON key of an option: its flag with '-' as '_'. */
static int json_key_is(const dt_cfg_opt *o, const char *key)
{
    const char *f = o->flag;
    for (; *f && *key; f++, key++)
        if (*key != (*f == '-' ? '_' : *f)) return 0;
    return !*f && !*key;
}

int dt_cfg_find_json(const char *key, int *is_alias)
{
    for (int i = 0; i < dt_cfg_noptions; i++) {
        const dt_cfg_opt *o = &dt_cfg_options[i];
        if (o->type == T_ACTION) continue;
        if (json_key_is(o, key)) return *is_alias = 0, i;
        if (o->alias && !strcmp(o->alias, key)) return *is_alias = 1, i;
    }
    return -1;
}

/* ---- presets and defaults --------------------------------------------- */

typedef struct preset {
    const char *name;
    int n_layer, n_head, n_embd, block_size, vocab_size;
    int experts, ffn, topk; /* a mixture of experts; experts 0: dense */
    /* The Llama family (NULL: GPT-2's): key/value heads, SwiGLU width,
     * rotary base, tied head. */
    const char *arch;
    int n_kv_head, llama_ffn;
    double rope_theta;
    int tie;
} preset;

/* The MoE presets keep their models' expert shapes at a width a CPU plans
 * and runs: Mixtral 8x7B's 8 experts of 3.5 C, top 2, and DeepSeek-MoE's
 * (V2-Lite, 16B) 64 experts of 0.6875 C, top 6; GPT-2's blocks (LayerNorm,
 * GELU experts, learned positions), no shared experts. */
static const preset presets[] = {
    {"tiny", 4, 4, 128, 128, 0, 0, 0, 0, NULL, 0, 0, 0, 0},
    {"gpt2", 12, 12, 768, 1024, 50257, 0, 0, 0, NULL, 0, 0, 0, 0},
    {"gpt2-medium", 24, 16, 1024, 1024, 50257, 0, 0, 0, NULL, 0, 0, 0, 0},
    {"gpt2-large", 36, 20, 1280, 1024, 50257, 0, 0, 0, NULL, 0, 0, 0, 0},
    {"gpt2-xl", 48, 25, 1600, 1024, 50257, 0, 0, 0, NULL, 0, 0, 0, 0},
    {"bench", 6, 6, 384, 256, 256, 0, 0, 0, NULL, 0, 0, 0, 0},
    {"mixtral-mini", 8, 8, 512, 1024, 32000, 8, 1792, 2, NULL, 0, 0, 0, 0},
    {"deepseek-moe-mini", 8, 8, 512, 1024, 32000, 64, 352, 6, NULL, 0, 0, 0, 0},
    /* Meta's Llama 3 sizes (3.2 for 1B, 3.1 for the rest), at the 8K
     * context they pretrained at (their files allow 128K). */
    {"llama3-1b", 16, 32, 2048, 8192, 128256, 0, 0, 0, "llama", 8, 8192, 500000, 1},
    {"llama3-8b", 32, 32, 4096, 8192, 128256, 0, 0, 0, "llama", 8, 14336, 500000, 0},
    {"llama3-70b", 80, 64, 8192, 8192, 128256, 0, 0, 0, "llama", 8, 28672, 500000, 0},
    {"llama3-405b", 126, 128, 16384, 8192, 128256, 0, 0, 0, "llama", 8, 53248, 500000, 0},
    /* Mixtral 8x7B: the Llama family with 8 SwiGLU experts a layer, top 2. */
    {"mixtral-8x7b", 32, 32, 4096, 32768, 32000, 8, 14336, 2, "llama", 8, 0, 1e6, 0},
};

/* A Llama preset's family and options, each unless given; a GPT-2 preset
 * takes the family back to GPT-2's (unless --arch was given). */
static void preset_family(dt_train_config *c, const preset *p)
{
    if (!c->given[DT_CFG_IDX(arch)]) strcpy(c->arch, p->arch ? p->arch : "gpt2");
    if (!p->arch) return;
    if (!c->given[DT_CFG_IDX(n_kv_head)]) c->n_kv_head = p->n_kv_head;
    if (!c->given[DT_CFG_IDX(ffn)]) c->ffn = p->llama_ffn;
    if (!c->given[DT_CFG_IDX(rope_theta)]) c->rope_theta = p->rope_theta;
    if (!c->given[DT_CFG_IDX(tie)]) c->tie = p->tie;
}

/* Sets the sizes that were not given explicitly, so that a preset never
 * undoes a size the user asked for, whichever came first. A dense preset
 * leaves the router's K as it is. */
static int hook_model(dt_train_config *c, const char *who, char *err, size_t n)
{
    if (!c->model[0]) return 0;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const preset *p = &presets[i];
        if (strcmp(p->name, c->model)) continue;
        if (!c->given[DT_CFG_IDX(n_layer)]) c->n_layer = p->n_layer;
        if (!c->given[DT_CFG_IDX(n_head)]) c->n_head = p->n_head;
        if (!c->given[DT_CFG_IDX(n_embd)]) c->n_embd = p->n_embd;
        if (!c->given[DT_CFG_IDX(block_size)]) c->block_size = p->block_size;
        if (!c->given[DT_CFG_IDX(vocab_size)]) c->vocab_size = p->vocab_size;
        if (!c->given[DT_CFG_IDX(num_experts)]) c->num_experts = p->experts;
        if (!c->given[DT_CFG_IDX(moe_ffn)]) c->moe_ffn = p->ffn;
        if (p->topk && !c->given[DT_CFG_IDX(moe_topk)]) c->moe_topk = p->topk;
        preset_family(c, p);
        return 0;
    }
    dt_strf(err, n, "%s: no preset named '%s'", who, c->model);
    return -1;
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
    strcpy(c->comm_dtype, "auto");
    strcpy(c->grad_accum_dtype, "fp32");
    strcpy(c->save_dtype, "fp32");
    strcpy(c->recompute, "none");
    strcpy(c->strategy, "ddp");
    c->bucket_mb = 25;
    c->zero_prefetch = 1;
    c->zero_reshard = 1;
    c->servers = 1;
    c->pp = 1;
    c->tp = 1;
    c->cp = 1;
    c->ep = 1;
    c->zero_quant_block = 256;
    c->zero_qgz_bits = 8;
    c->offload_overlap = 1;
    c->zero_hpz = 1;
    strcpy(c->offload_optimizer, "none");
    strcpy(c->offload_param, "none");
    c->offload_buffers = 4;
    c->sub_group_size = 4 << 20;
    strcpy(c->arch, "gpt2");
    c->rope_theta = 10000.0;
    c->norm_eps = 1e-5;
    c->moe_topk = 2;
    c->moe_aux_coeff = 1e-2;
    c->moe_bias_rate = 1e-3;
    c->aio_block_size = 1L << 20;
    c->aio_queue_depth = 8;
    strcpy(c->cp_algo, "ring");
    strcpy(c->pp_schedule, "1f1b");
    strcpy(c->pp_partition, "uniform");
    c->pp_virtual = 1;
    strcpy(c->ps_mode, "sync");
    c->staleness = 2;
    strcpy(c->compress, "none");
    c->eval_batches = 8;
    c->keep_last = 3;
    c->snapshot_every = 1;
    c->print_every = 1;
    strcpy(c->log_ranks, "0");
}

/* ---- hooks ------------------------------------------------------------- */

/* --min-lr and --min-lr-ratio say the same thing two ways: the later wins. */
static int hook_min_lr(dt_train_config *c, const char *who, char *err, size_t n)
{
    (void)who, (void)err, (void)n;
    c->given[DT_CFG_IDX(min_lr_ratio)] = 0;
    return 0;
}

static int hook_min_lr_ratio(dt_train_config *c, const char *who, char *err, size_t n)
{
    (void)who, (void)err, (void)n;
    c->given[DT_CFG_IDX(min_lr)] = 0;
    return 0;
}

static int hook_resume(dt_train_config *c, const char *who, char *err, size_t n)
{
    (void)who, (void)err, (void)n;
    c->resume_flag = 1;
    return 0;
}

/* ZeRO shards what data parallelism replicates: it runs over the ranks of
 * --strategy ddp, and its stage-3 settings mean nothing below stage 3. */
int dt_cfg_check_zero(const dt_train_config *c, char *err, size_t n)
{
    if (c->zero_stage > 0 && strcmp(c->strategy, "ddp") != 0)
        return dt_strf(err, n, "ZeRO stage %d shards the state over the ranks of --strategy "
                       "ddp; --strategy %s %s: use --strategy ddp, or stage 0",
                       c->zero_stage, c->strategy,
                       !strcmp(c->strategy, "ps") ? "already splits the parameters over its servers"
                                                  : "runs its devices as threads of one process"),
               -1;
    static const size_t stage3[] = {offsetof(dt_train_config, zero_prefetch),
                                    offsetof(dt_train_config, zero_reshard),
                                    offsetof(dt_train_config, zero_prefetch_elems),
                                    offsetof(dt_train_config, zero_max_live),
                                    offsetof(dt_train_config, zero_persist),
                                    offsetof(dt_train_config, zero_qwz),
                                    offsetof(dt_train_config, zero_quant_block),
                                    offsetof(dt_train_config, offload_param),
                                    offsetof(dt_train_config, zero_hpz),
                                    offsetof(dt_train_config, zero_qgz),
                                    offsetof(dt_train_config, zero_qgz_bits)};
    if (DT_CONFIG_GIVEN(c, zero_prefetch) && DT_CONFIG_GIVEN(c, zero_prefetch_elems))
        return dt_strf(err, n, "--zero-prefetch counts layers, --zero-prefetch-elems "
                       "(stage3_prefetch_bucket_size) parameters: give one of them"), -1;
    if (dt_cfg_check_offload(c, err, n)) return -1;
    if (DT_CONFIG_GIVEN(c, zero_quant_block) && !c->zero_qwz && !c->zero_qgz)
        return dt_strf(err, n, "--zero-quant-block sizes qwZ's and qgZ's blocks: add "
                       "--zero-quantized-weights or --zero-quantized-gradients"), -1;
    if (c->zero_qgz_bits != 8 && c->zero_qgz_bits != 4)
        return dt_strf(err, n, "--zero-qgz-bits %d: qgZ sends 8- or 4-bit values; use 8 or 4",
                       c->zero_qgz_bits), -1;
    if (DT_CONFIG_GIVEN(c, zero_qgz_bits) && !c->zero_qgz)
        return dt_strf(err, n, "--zero-qgz-bits sizes qgZ's values: add "
                       "--zero-quantized-gradients"), -1;
    if (c->zero_qgz && strcmp(c->grad_accum_dtype, "fp32"))
        return dt_strf(err, n, "--zero-quantized-gradients quantizes fp32 gradients: use "
                       "--grad-accum-dtype fp32 with it"), -1;
    if (c->zero_qgz && DT_CONFIG_GIVEN(c, comm_dtype) && strcmp(c->comm_dtype, "auto"))
        return dt_strf(err, n, "--comm-dtype %s with --zero-quantized-gradients: qgZ sends "
                       "its own %d-bit blocks; drop --comm-dtype", c->comm_dtype,
                       c->zero_qgz_bits), -1;
    for (size_t i = 0; c->zero_stage < 3 && i < sizeof stage3 / sizeof stage3[0]; i++)
        if (dt_config_given_at(c, stage3[i]))
            return dt_strf(err, n, "--%s applies to --zero-stage 3 (parameters sharded); this "
                           "run has stage %d", dt_cfg_options[dt_cfg_opt_at(stage3[i])].flag,
                           c->zero_stage), -1;
    return 0;
}

/* NVMe offload's settings need it; its path needs it; it streams the
 * default update, which the parameter server's servers do not run. The
 * parameters on NVMe stream through the optimizer's file. */
int dt_cfg_check_offload(const dt_train_config *c, char *err, size_t n)
{
    int nvme = !strcmp(c->offload_optimizer, "nvme") || !strcmp(c->offload_param, "nvme");
    static const size_t nvme_only[] = {offsetof(dt_train_config, nvme_path),
                                       offsetof(dt_train_config, offload_buffers),
                                       offsetof(dt_train_config, sub_group_size),
                                       offsetof(dt_train_config, aio_block_size),
                                       offsetof(dt_train_config, aio_queue_depth),
                                       offsetof(dt_train_config, offload_overlap)};
    if (!strcmp(c->offload_param, "nvme") && strcmp(c->offload_optimizer, "nvme"))
        return dt_strf(err, n, "--offload-param nvme: the update streams the parameters "
                       "through the optimizer's file; add --offload-optimizer nvme"), -1;
    for (size_t i = 0; !nvme && i < sizeof nvme_only / sizeof nvme_only[0]; i++)
        if (dt_config_given_at(c, nvme_only[i]))
            return dt_strf(err, n, "--%s applies to --offload-optimizer nvme; this run has %s",
                           dt_cfg_options[dt_cfg_opt_at(nvme_only[i])].flag,
                           c->offload_optimizer), -1;
    if (nvme && !c->nvme_path[0])
        return dt_strf(err, n, "--offload-%s nvme needs --nvme-path DIR (nvme_path): "
                       "the directory its files go to",
                       strcmp(c->offload_optimizer, "nvme") ? "param" : "optimizer"), -1;
    if (nvme && c->aio_block_size % 4096)
        return dt_strf(err, n, "--aio-block-size %ld: a multiple of 4096 bytes (direct I/O "
                       "moves whole pages), e.g. %ld", c->aio_block_size,
                       (c->aio_block_size / 4096 + 1) * 4096), -1;
    if (strcmp(c->offload_optimizer, "none") && strcmp(c->strategy, "ddp"))
        return dt_strf(err, n, "--offload-optimizer %s streams the optimizer of --strategy "
                       "ddp (and its ZeRO stages); --strategy %s updates elsewhere",
                       c->offload_optimizer, c->strategy), -1;
    if (DT_CONFIG_GIVEN(c, offload_overlap) && c->offload_overlap && c->zero_stage < 3)
        return dt_strf(err, n, "--offload-overlap defers stage 3's updates into the next "
                       "forward; this run has stage %d", c->zero_stage), -1;
    if (DT_CONFIG_GIVEN(c, offload_overlap) && c->offload_overlap &&
        !strcmp(c->offload_param, "nvme"))
        return dt_strf(err, n, "--offload-overlap with --offload-param nvme: the pieces are "
                       "read from the file ahead of their update, so that run updates after "
                       "backward; drop --offload-overlap"), -1;
    if (!strcmp(c->offload_param, "nvme") && !strcmp(c->dtype, "bf16"))
        return dt_strf(err, n, "--offload-param nvme keeps fp32 pieces on the disk; with "
                       "--dtype bf16 use --offload-param cpu, or --dtype fp32"), -1;
    return 0;
}

dt_offload_opts dt_config_offload_opts(const dt_train_config *c)
{
    dt_offload_opts o = dt_offload_defaults(c->nvme_path);
    o.buffers = c->offload_buffers;
    o.chunk_floats = (size_t)c->sub_group_size;
    o.block_bytes = (size_t)c->aio_block_size;
    o.depth = (unsigned)c->aio_queue_depth;
    return o;
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
    char buf[sizeof((dt_train_config *)0)->comm_algo];
    dt_strf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq || eq == item || !eq[1])
            return dt_strf(err, n, "'%s' is not COLLECTIVE=ALGORITHM (for example "
                           "allreduce=ring)", item), -1;
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
        return dt_strf(err, n, "'%s' has no choice of algorithms (allreduce, broadcast, "
                       "allgather, reduce_scatter, alltoall do)", coll), -1;
    if (!strcmp(algo, "auto")) return 0;
    char list[256] = "auto";
    for (int i = 0; i < k && i < 32; i++) {
        if (!strcmp(names[i], algo)) return 0;
        dt_strf(list + strlen(list), sizeof list - strlen(list), ", %s", names[i]);
    }
    return dt_strf(err, n, "'%s' is not one of the %s algorithms (choices: %s)", algo, coll,
                   list), -1;
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
