/* Training configuration: one struct, filled in layers where a later one
 * wins: defaults (dt_config_defaults), a model preset, a JSON file
 * (--config, DeepSpeed's keys plus dtrain's own), then command-line flags;
 * dt_config_validate then checks it and fills the inferred values.
 *
 * Typical use:
 *     dt_train_config c;
 *     char err[512];
 *     dt_config_defaults(&c);
 *     int rc = dt_config_parse_args(&c, argc, argv, err, sizeof err);
 *     if (rc == 1) return 0;                      // --help was printed
 *     if (rc || dt_config_validate(&c, dp_size, err, sizeof err)) { report err }
 *
 * One table (config/table.c) describes every option (flag spelling, JSON
 * key, type, range, help), so flags, JSON keys and --help cannot drift
 * apart; config/internal.h lists the files that share the work.
 * Presets: tiny (the default), gpt2, gpt2-medium, gpt2-large, gpt2-xl, bench.
 * A preset sets the model sizes that were not given explicitly, wherever
 * they were given (JSON or flags), so "--n-layer 2 --model gpt2" and
 * "--model gpt2 --n-layer 2" mean the same. */
#ifndef DT_TRAIN_CONFIG_CONFIG_H
#define DT_TRAIN_CONFIG_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "model/moe.h"
#include "model/offload.h"
#include "parallel/registry.h"

#define DT_CONFIG_PATH 4096
/* Upper bound on the options of the table in config/table.c (checked there). */
#define DT_CONFIG_MAX_OPTIONS 128

typedef struct dt_train_config {
    /* Model. vocab_size 0: taken from --init or the data (256 for text). */
    char model[32]; /* preset name, or "" for sizes given one by one */
    int n_layer, n_head, n_embd, vocab_size, block_size;
    /* The family (model/arch.h) and the Llama family's options. */
    char arch[16];          /* --arch gpt2|llama */
    int n_kv_head;          /* --n-kv-head (Megatron's --num-query-groups); 0 = n_head */
    int ffn;                /* --ffn-hidden-size (SwiGLU's); 0 = the family's */
    double rope_theta;      /* --rope-theta (Megatron's --rotary-base) */
    double norm_eps;        /* --norm-eps (RMSNorm's) */
    int tie;                /* --tie-word-embeddings: the head is the embedding */
    char blocks[160]; /* a layer's blocks (model/block.h); "" = GPT-2's, or with experts
                      * GPT-2's with a moe branch for its MLP */
    /* Mixture of experts (model/moe.h; Megatron's flags). */
    int num_experts;        /* E; 0 = a dense model */
    int moe_ffn;            /* --moe-ffn-hidden-size; 0 = 4 n_embd */
    int moe_topk;           /* --moe-router-topk */
    double moe_capacity;    /* --moe-expert-capacity-factor; 0 = dropless */
    double moe_aux_coeff;   /* --moe-aux-loss-coeff (sequence-wise) */
    double moe_z_coeff;     /* --moe-z-loss-coeff */
    int moe_expert_bias;    /* --moe-router-enable-expert-bias */
    double moe_bias_rate;   /* --moe-router-bias-update-rate */
    int moe_force_balance;  /* --moe-router-force-load-balancing */
    int moe_log_load;       /* --moe-per-layer-logging: each layer's load on the log */

    /* Files; "" means unset. */
    char data[DT_CONFIG_PATH], val_data[DT_CONFIG_PATH], init[DT_CONFIG_PATH];
    char out_dir[DT_CONFIG_PATH];    /* checkpoints go here; "" = none */
    char save_final[DT_CONFIG_PATH]; /* safetensors file written at the end */
    char save_dtype[8];              /* --save-final's values: fp32 | bf16 | fp16 */
    char log_json[DT_CONFIG_PATH];   /* one JSON object per step; "-" = stdout */
    char resume[DT_CONFIG_PATH];     /* checkpoint dir; "" with resume_flag = latest in out_dir */
    double val_fraction; /* tail of data held out for validation when no val_data */

    /* Batch. train_batch_size = batch_size x grad_accum x data-parallel size
     * (DeepSpeed's rule); dt_config_validate infers the one not given. */
    int batch_size;        /* sequences per rank per micro-batch */
    int seq_len;           /* tokens per sequence; 0 = block_size (validate fills it) */
    int grad_accum;        /* micro-batches per optimizer step */
    long train_batch_size; /* global sequences per optimizer step; 0 = inferred */

    /* Optimization; see dt_config_lr_at for the schedule. */
    long steps; /* optimizer steps */
    double lr, min_lr;
    double min_lr_ratio; /* when given, validate sets min_lr = min_lr_ratio x lr */
    char lr_schedule[16]; /* constant | cosine | linear */
    long warmup_steps;
    char optimizer[8]; /* adamw | adam | sgd */
    double beta1, beta2, eps, weight_decay, momentum;
    double grad_clip; /* max global gradient norm; 0 = no clipping */

    /* Run. */
    unsigned long long seed;
    int shuffle;
    int threads;  /* compute threads per rank, at most 1024; 0 = all online cores */
    char dtype[8]; /* fp32 | bf16 */
    char comm_dtype[8];       /* gradients travel as: auto (= dtype) | fp32 | bf16 */
    char grad_accum_dtype[8]; /* gradients accumulate in: fp32 | bf16 */
    char recompute[12]; /* activations rebuilt in backward: none | selective | full */
    long eval_every;   /* steps between evaluations; 0 = only at the end */
    long eval_batches; /* batches per evaluation; 0 = no evaluation */
    long save_every;   /* steps between checkpoints; 0 = only at the end (with out_dir) */
    long keep_last;    /* checkpoints kept in out_dir */
    long snapshot_every; /* with restarts: steps between in-memory snapshots; 0 = none */
    long print_every;  /* steps between log lines */
    char log_ranks[4]; /* which ranks print: 0 (rank 0 speaks for the job) | all */
    int zero_stage;    /* zero_optimization.stage: 0 (none) to 3, over the ddp ranks */
    int zero_prefetch; /* stage 3: segments (layers) gathered ahead of use */
    int zero_reshard;  /* stage 3: let a layer go after forward (1) or keep it for backward (0) */
    double zero_prefetch_elems; /* stage3_prefetch_bucket_size: prefetch in elements (0: by count) */
    double zero_max_live;  /* stage3_max_live_parameters: gathered elements at most (0: no limit) */
    double zero_persist;   /* stage3_param_persistence_threshold: smaller segments stay gathered */
    char strategy[32]; /* how the work is shared: ddp | dp | ps | a registered kind */
    double bucket_mb;  /* DDP gradient bucket size, MiB */
    int devices;       /* dp: worker threads acting as devices; 0 = online cores */
    int servers;       /* ps: ranks that hold the parameters (the last ones) */
    char ps_mode[8];   /* ps: sync | async */
    int staleness;     /* ps async: steps a worker may run ahead of the slowest */
    int fixed_staleness; /* ps async: pushes in a fixed order, each exactly `staleness` late */
    char compress[24]; /* ps: what workers push: none | topk:R | int8 */
    char comm_algo[160]; /* forced collective algorithms: "allreduce=ring,allgather=bruck" */
    int pp;              /* pipeline stages (--pipeline-model-parallel-size); 1 = none */
    int dp;              /* data-parallel size; 0 = the ranks / (tp cp pp) */
    int tp;              /* tensor-parallel ranks per group (--tensor-model-parallel-size); 1 = none */
    int zero_qwz;          /* stage 3: ZeRO++ qwZ (zero_quantized_weights) */
    int zero_quant_block;  /* qwZ, qgZ: values per scale */
    int zero_qgz;          /* stage 3: ZeRO++ qgZ (zero_quantized_gradients) */
    int zero_qgz_bits;     /* qgZ: 8 or 4 */
    int zero_hpz;          /* stage 3: ZeRO++ hpZ's group size (zero_hpz_partition_size); 1 = off */
    char offload_optimizer[8]; /* none | cpu | nvme (zero_optimization.offload_optimizer) */
    char offload_param[8];     /* none | cpu | nvme (zero_optimization.offload_param) */
    int offload_overlap;       /* stage 3, optimizer on NVMe: updates deferred into the next
                                * forward, segment by segment */
    char nvme_path[DT_CONFIG_PATH]; /* where nvme offload's files go */
    int offload_buffers;   /* offload_optimizer.buffer_count: chunk buffers */
    double sub_group_size; /* zero_optimization.sub_group_size: floats per chunk of a state */
    long aio_block_size;   /* aio.block_size: bytes per request */
    int aio_queue_depth;   /* aio.queue_depth: requests in flight */
    int sequence_parallel; /* with tp: Megatron's --sequence-parallel */
    int cp;              /* context-parallel ranks per group (--context-parallel-size); 1 = none */
    int ep;              /* expert-parallel ranks per group (--expert-model-parallel-size),
                          * taken from the data-parallel ones; 1 = none */
    char cp_algo[16];    /* ring | ulysses */
    char pp_schedule[16]; /* naive | gpipe | 1f1b | interleaved | zb1p */
    char pp_partition[12]; /* layers per stage: uniform | params | cost */
    int pp_virtual;      /* interleaved: model chunks per rank */
    char trace[DT_CONFIG_PATH]; /* Chrome/Perfetto trace of the run; "" = none */
    int profile;                /* --profile: each part's time against its bound */
    int resume_flag;   /* --resume was given (with or without a directory) */

    /* Internal: given[i] = option i of the table was set explicitly, so that
     * a preset does not undo an explicit size and validate knows which batch
     * number to infer. Zeroed by dt_config_defaults. */
    unsigned char given[DT_CONFIG_MAX_OPTIONS];
} dt_train_config;

/* The model's experts and routing: E and F (the file's, when it gives
 * them) with the routing options of c. */
void dt_config_moe(const dt_train_config *c, int experts, int ffn, dt_moe_config *out);
/* The family (--arch) and its options into a model's configuration, its
 * blocks spelled out when none were given. */
void dt_config_family(const dt_train_config *c, dt_gpt_config *out);

/* The defaults: model tiny (L4 H4 C128 T128), batch 8, seq_len = block,
 * accum 1, 200 steps, AdamW (PyTorch defaults, wd 0.01) at lr 1e-3 with a
 * cosine schedule to 0 and no warmup, clip 1.0, seed 1337, fp32. */
void dt_config_defaults(dt_train_config *c);

/* Applies the flags of argv[1..argc-1] (argv[0], the program or subcommand
 * name, is skipped). Flags are "--name value" or "--name=value". Every
 * --config FILE is loaded first, in order, wherever it appears; then the
 * other flags in order. c must hold defaults or an earlier state.
 * Returns 0, -1 with a message naming the flag, or 1 when --help (-h) was
 * given: the usage was printed to stdout and the caller should exit 0. */
int dt_config_parse_args(dt_train_config *c, int argc, char **argv, char *err, size_t errlen);

/* Loads a JSON config file onto c: one object, nothing after it but blank
 * space. Keys: dtrain's flag names in snake_case (n_layer, lr_schedule, ...)
 * and DeepSpeed's keys (train_batch_size, train_micro_batch_size_per_gpu,
 * gradient_accumulation_steps, optimizer, scheduler, bf16, fp16,
 * gradient_clipping, steps_per_print, zero_optimization,
 * activation_checkpointing, wall_clock_breakdown); config/deepspeed.c
 * describes what each DeepSpeed key means here. A DeepSpeed key dtrain has
 * no counterpart for is refused (it says it is not supported yet) unless
 * its value changes nothing. Where a file gives a setting both ways,
 * dtrain's own key wins. Unknown keys are warnings (through dt_log, naming
 * the key and the file); wrong types and out-of-range values are errors. */
int dt_config_load_json(dt_train_config *c, const char *path, char *err, size_t errlen);

/* Checks every field (ranges, n_embd % n_head, seq_len <= block_size,
 * warmup_steps <= steps, min_lr <= lr, --resume needs --out or a directory,
 * options that act only with another one: --keep-last needs --out, ...)
 * and fills the inferred values: seq_len, min_lr from min_lr_ratio,
 * and whichever of train_batch_size, grad_accum, batch_size was not given
 * (with all three given, a mismatch is an error that shows the numbers).
 * When only train_batch_size is given the micro-batch is held (it sets the
 * memory) and grad_accum is inferred. data_parallel_size >= 1.
 * With --init or --resume the model's sizes come from the file: only those
 * given explicitly are checked here, and the trainer checks the merged
 * sizes (dt_gpt_config_check) once the file has given the others. */
int dt_config_validate(dt_train_config *c, int data_parallel_size, char *err, size_t errlen);

/* Calls apply(ctx, collective, algorithm) for each pair of a --comm-algo
 * spec ("allreduce=ring,broadcast=binomial"); stops at the first non-zero
 * return. 0, or -1 with a message when the spec is malformed or apply
 * refused a pair. */
int dt_config_each_comm_algo(const char *spec,
                             int (*apply)(void *ctx, const char *coll, const char *algo,
                                          char *err, size_t n),
                             void *ctx, char *err, size_t n);

/* The data-parallel size of the strategy in a job of `world` processes: ddp
 * all ranks, dp --devices (one process only), ps the ranks that are not
 * servers. Refuses options of one strategy given with another. 0, or -1
 * with a message. */
int dt_config_data_parallel_size(const dt_train_config *c, int world, int *dp_size, char *err,
                                 size_t errlen);

/* The settings of config that the parallel strategies read. */
dt_parallel_opts dt_config_parallel_opts(const dt_train_config *c);
/* The NVMe offload's settings (model/offload.h) from the configuration. */
dt_offload_opts dt_config_offload_opts(const dt_train_config *c);

/* A few lines summarizing the run (model, data, batch, optimizer, run). */
void dt_config_print(const dt_train_config *c, FILE *f);

/* The options, grouped by topic, each with its default. */
void dt_config_usage(FILE *f);

/* Whether the field at this offset was set explicitly (JSON or flag) rather
 * than by a default or a preset: DT_CONFIG_GIVEN(c, seq_len). */
int dt_config_given_at(const dt_train_config *c, size_t field_offset);
#define DT_CONFIG_GIVEN(c, field) dt_config_given_at((c), offsetof(dt_train_config, field))

/* Learning rate of optimizer step `step` (counted from 0), W = warmup_steps,
 * S = steps:
 *   step < W:  lr * (step + 1) / W                       (linear warmup from 0)
 *   otherwise, with p = (step - W) / (S - W) clamped to [0, 1] (1 when S == W):
 *     constant: lr
 *     cosine:   min_lr + 0.5 (lr - min_lr) (1 + cos(pi p))
 *     linear:   min_lr + (lr - min_lr) (1 - p)
 * Steps past S stay at the final value. */
double dt_config_lr_at(const dt_train_config *c, long step);

#endif
