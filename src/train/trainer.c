/* The training loop of one rank, whatever the strategy: data, model,
 * optimizer, evaluation, logging and checkpoints around the strategy
 * interface (parallel/strategy.h), which decides what this rank holds and
 * how its gradients and updates meet the other ranks'. See trainer.h.
 *
 * Step s trains on the global batch of G sequences whose counters are
 * s*G .. s*G+G-1 (sampler.h maps counters to sequences); the strategy
 * gives each rank its block. The logged loss of step s is the mean over
 * the global batch, before the update. */
#include "train/trainer.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/bootstrap.h"
#include "core/file.h"
#include "core/log.h"
#include "core/str.h"
#include "core/timer.h"
#include "dtrain/comm.h"
#include "kernels/threads.h"
#include "parallel/registry.h"
#include "train/checkpoint.h"
#include "train/corpus.h"
#include "train/metrics.h"
#include "train/model_source.h"
#include "train/weights.h"

typedef struct {
    dt_train_config *cfg;
    dt_gpt model;
    dt_optimizer opt;
    dt_dataset *train, *val;
    dt_sampler train_order, val_order;
    dt_rank r;          /* what the strategy sees; r.err is the run's error message */
    dt_strategy S;
    int threads;
    long global_batch;  /* sequences per optimizer step */
    long step;          /* next optimizer step to run */
    long steps_run;     /* steps run by this process */
    uint64_t seq_counter; /* training sequences consumed */
    double last_loss;
    int stop;           /* the signal the ranks agreed to stop on, or 0 */
    int dp_size;        /* blocks of each global batch, as the configuration was validated */
    FILE *json;         /* --log-json, or NULL */
    FILE *out;          /* human-readable lines (rank 0's; /dev/null elsewhere) */
} trainer;

#define ERR(t) (t)->r.err, sizeof (t)->r.err

/* The first SIGINT or SIGTERM asks the loop to stop after the current step
 * and save; the handler is installed with SA_RESETHAND, so a second one
 * kills the process at once. */
static volatile sig_atomic_t stop_signal;

static void on_interrupt(int sig) { stop_signal = sig; }

static int comm_failed(trainer *t, dt_comm *c, const char *what)
{
    return dt_strf(ERR(t), "%s: %s", what, dt_comm_error(c)), -1;
}

/* ---- data --------------------------------------------------------------- */

static int open_data(trainer *t)
{
    const dt_train_config *c = t->cfg;
    char train_path[DT_CONFIG_PATH], val_path[DT_CONFIG_PATH];
    const char *train_file = c->data, *val_file = c->val_data;
    if (!c->data[0]) {
        if (dt_default_corpus(train_path, val_path, sizeof train_path, ERR(t))) return -1;
        train_file = train_path;
        if (!c->val_data[0]) val_file = val_path;
    }
    dt_dataset *all;
    if (dt_dataset_open(train_file, &all, ERR(t))) return -1;
    if (val_file[0]) {
        t->train = all;
        return dt_dataset_open(val_file, &t->val, ERR(t));
    }
    if (c->val_fraction <= 0 || c->eval_batches == 0) {
        t->train = all;
        return 0;
    }
    int rc = dt_dataset_split(all, c->val_fraction, &t->train, &t->val, ERR(t));
    dt_dataset_close(all);
    return rc;
}

static int fetch_batch(void *ctx, uint64_t first, int n, int32_t *inputs, int32_t *targets,
                       char *err, size_t errlen)
{
    trainer *t = ctx;
    return dt_dataset_batch(t->train, &t->train_order, first, n, t->r.T, inputs, targets, err,
                            errlen);
}

static double lr_at(const void *cfg, long step) { return dt_config_lr_at(cfg, step); }

/* ---- what this rank holds ------------------------------------------------- */

/* Every file the run will write is checked before the first step: a typo
 * in --save-final must not cost the training it would have saved. */
static int check_outputs(trainer *t)
{
    const dt_train_config *c = t->cfg;
    if (!t->S.writes_checkpoints) return 0;
    if (c->out_dir[0] && dt_check_dir_writable("--out", c->out_dir, ERR(t))) return -1;
    if (c->save_final[0] && dt_check_output_file("--save-final", c->save_final, ERR(t)))
        return -1;
    return 0;
}

static int alloc_model(trainer *t)
{
    dt_gpt *m = &t->model;
    if (dt_gpt_alloc_params(m) || dt_gpt_alloc_grads(m) || dt_gpt_alloc_acts(m, t->r.B, t->r.T))
        return dt_strf(ERR(t), "%s", m->error), -1;
    t->r.inputs = malloc((size_t)t->r.B * t->r.T * sizeof(int32_t));
    t->r.targets = malloc((size_t)t->r.B * t->r.T * sizeof(int32_t));
    if (!t->r.inputs || !t->r.targets) return dt_strf(ERR(t), "out of memory for the batch"), -1;
    return 0;
}

/* Optimizer state for floats [lo, hi) of the flat layout. */
static int init_optimizer(trainer *t, size_t lo, size_t hi)
{
    const dt_train_config *c = t->cfg;
    dt_opt_kind kind;
    if (dt_opt_kind_parse(c->optimizer, &kind) ||
        dt_optimizer_init(&t->opt, kind, hi - lo, c->beta1, c->beta2, c->eps, c->weight_decay,
                          c->momentum))
        return dt_strf(ERR(t), "optimizer %s: cannot set up its state", c->optimizer), -1;
    t->opt.base = lo;
    return 0;
}

static int resume(trainer *t, const char *dir)
{
    dt_ckpt_state st;
    if (dt_ckpt_load(dir, &t->model, &t->opt, &st, ERR(t))) return -1;
    if (st.seq_len != t->r.T || st.shuffle != t->cfg->shuffle || st.seed != t->cfg->seed)
        return dt_strf(ERR(t),
                       "%s: saved with seq_len %d, shuffle %d, seed %llu; this run has %d, %d, "
                       "%llu (the data order would differ)",
                       dir, st.seq_len, st.shuffle, (unsigned long long)st.seed, t->r.T,
                       t->cfg->shuffle, (unsigned long long)t->cfg->seed), -1;
    uint64_t ntok = dt_dataset_ntokens(t->train);
    if (st.data_tokens != 0 && st.data_tokens != ntok)
        return dt_strf(ERR(t),
                       "%s: trained on %llu tokens of data, this run has %llu (%s): other data "
                       "would break the data order",
                       dir, (unsigned long long)st.data_tokens, (unsigned long long)ntok,
                       dt_dataset_name(t->train)), -1;
    if (st.global_batch != t->global_batch)
        DT_WARN("%s: global batch was %ld sequences, now %ld", dir, st.global_batch,
                t->global_batch);
    t->step = st.step;
    t->seq_counter = st.seq_counter;
    t->last_loss = st.last_loss;
    fprintf(t->out, "resumed from %s at step %ld\n", dir, t->step);
    return 0;
}

/* The starting weights of a rank that holds the model: a checkpoint, a
 * weights file, or the initialisation. */
static int starting_weights(trainer *t, const char *resume_dir)
{
    const dt_train_config *c = t->cfg;
    if (dt_dataset_check(t->train, t->r.T, ERR(t))) return -1;
    /* Validation data too short for one sequence would fail only at the end. */
    if (t->val && c->eval_batches > 0 && dt_dataset_check(t->val, t->r.T, ERR(t))) return -1;
    if (resume_dir) return resume(t, resume_dir);
    if (c->init[0]) return dt_weights_load(&t->model, c->init, ERR(t));
    dt_gpt_init_weights(&t->model, c->seed);
    return 0;
}

/* The model's layout, then what the strategy says this rank holds, then
 * its starting state; finally the ranks agree on it. */
static int setup_model(trainer *t, const char *resume_dir)
{
    const dt_train_config *c = t->cfg;
    dt_gpt_config mc;
    if (dt_model_source_config(c, resume_dir, t->train, t->val, &t->r.T, &mc, ERR(t)))
        return -1;
    dt_precision prec = strcmp(c->dtype, "bf16") == 0 ? DT_PREC_BF16 : DT_PREC_F32;
    if (dt_gpt_create_layout(&t->model, &mc, prec, ERR(t))) return -1;
    dt_share share;
    if (dt_strategy_plan(&t->S, &t->model, &share)) return -1;
    if (share.model && alloc_model(t)) return -1;
    if (share.opt_hi > share.opt_lo && init_optimizer(t, share.opt_lo, share.opt_hi)) return -1;
    if (share.model && starting_weights(t, resume_dir)) return -1;
    t->r.first_step = t->step;
    /* The batch arithmetic was validated for dp_size blocks: a strategy
     * that split otherwise would train on overlapping data. */
    if (!dt_strategy_serves(&t->S) && t->S.dp_size != t->dp_size)
        return dt_strf(ERR(t), "strategy %s splits each batch into %d blocks, the configuration "
                       "was checked for %d (a bug)", t->cfg->strategy, t->S.dp_size, t->dp_size),
               -1;
    return dt_strategy_start(&t->S);
}

/* ---- one optimizer step --------------------------------------------------- */

static int train_step(trainer *t, double *loss, double *norm)
{
    double lr = dt_config_lr_at(t->cfg, t->step);
    if (dt_strategy_step(&t->S, t->step, t->seq_counter, lr, loss, norm)) return -1;
    t->seq_counter += (uint64_t)t->global_batch;
    return 0;
}

/* Mean loss over up to eval_batches micro-batches of the validation data,
 * always the same sequences (the first ones, in order), split over the
 * ranks of comm (NULL: this rank alone). */
static int evaluate(trainer *t, dt_comm *comm, double *loss_out)
{
    int B = t->r.B, T = t->r.T;
    uint64_t nseq = dt_dataset_nseq(t->val, T);
    uint64_t want = (uint64_t)t->cfg->eval_batches * (uint64_t)B;
    uint64_t total = want < nseq ? want : nseq;
    uint64_t index = comm ? (uint64_t)dt_comm_rank(comm) : 0;
    uint64_t size = comm ? (uint64_t)dt_comm_size(comm) : 1;
    double sum[1] = {0};
    /* Rank r evaluates micro-batches r, r + size, ...; the sums are added. */
    for (uint64_t first = index * B; first < total; first += (uint64_t)B * size) {
        int b = (int)(total - first < (uint64_t)B ? total - first : (uint64_t)B);
        if (dt_dataset_batch(t->val, &t->val_order, first, b, T, t->r.inputs, t->r.targets,
                             ERR(t)))
            return -1;
        double loss = dt_gpt_forward(&t->model, t->r.inputs, t->r.targets, b, T);
        if (loss < 0) return dt_strf(ERR(t), "%s", t->model.error), -1;
        sum[0] += loss * b;
    }
    if (comm && dt_allreduce(comm, sum, sum, 1, DT_F64, DT_SUM))
        return comm_failed(t, comm, "evaluation");
    *loss_out = sum[0] / (double)total;
    return 0;
}

static int report_eval(trainer *t, int final)
{
    if (!t->val || t->cfg->eval_batches == 0) return 0;
    dt_comm *group;
    if (!dt_strategy_eval_group(&t->S, final, &group)) return 0;
    if (dt_dataset_check(t->val, t->r.T, ERR(t))) return -1;
    double loss = 0;
    if (evaluate(t, group, &loss)) return -1;
    fprintf(t->out, "val loss %.4f (step %ld)\n", loss, t->step);
    if (t->json) fprintf(t->json, "{\"step\":%ld,\"val_loss\":%.9g}\n", t->step - 1, loss);
    return 0;
}

/* Collective: the strategy gathers what the writer needs, then it writes. */
static int save_checkpoint(trainer *t)
{
    if (dt_strategy_before_save(&t->S)) return -1;
    if (!t->S.writes_checkpoints) return 0;
    dt_ckpt_state st = {.step = t->step,
                        .seq_counter = t->seq_counter,
                        .seed = t->cfg->seed,
                        .shuffle = t->cfg->shuffle,
                        .seq_len = t->r.T,
                        .global_batch = t->global_batch,
                        .last_loss = t->last_loss,
                        .data_tokens = dt_dataset_ntokens(t->train)};
    char path[DT_CONFIG_PATH + 64];
    if (dt_ckpt_save(t->cfg->out_dir, &t->model, &t->opt, &st, t->cfg->keep_last, path,
                     sizeof path, ERR(t)))
        return -1;
    fprintf(t->out, "checkpoint %s\n", path);
    return 0;
}

/* ---- the loop ------------------------------------------------------------- */

/* Every rank's memory at its peak, printed by rank 0: the ranks of some
 * strategies hold very different things. Collective over the job. */
static int print_rank_memory(trainer *t, const char *title)
{
    unsigned long long mine[DT_MEM_SNAPSHOT], *all = NULL;
    dt_memory_snapshot(mine, 1);
    dt_comm *world = t->r.world;
    if (!world) {
        dt_print_memory_snapshot(t->out, title, mine);
        return 0;
    }
    if (t->r.rank == 0 && !(all = malloc((size_t)t->r.size * sizeof mine)))
        return dt_strf(ERR(t), "out of memory"), -1;
    if (dt_gather(world, mine, all, DT_MEM_SNAPSHOT, DT_I64, 0)) {
        free(all);
        return comm_failed(t, world, "gathering memory use");
    }
    fprintf(t->out, "%s:\n", title);
    for (int r = 0; all && r < t->r.size; r++) {
        char role[32] = "", label[64];
        dt_strategy_rank_label(&t->S, r, role, sizeof role);
        dt_strf(label, sizeof label, "  rank %d%s%s%s", r, role[0] ? " (" : "", role,
                role[0] ? ")" : "");
        dt_print_memory_snapshot(t->out, label, all + (size_t)r * DT_MEM_SNAPSHOT);
    }
    free(all);
    return 0;
}

static void print_header(trainer *t)
{
    const dt_gpt *m = &t->model;
    dt_config_print(t->cfg, t->out);
    const char *emulated = m->prec == DT_PREC_BF16 && !dt_matmul_bf16_native()
                               ? " (emulated: this CPU has no bf16 kernel, fp32 speed)"
                               : "";
    fprintf(t->out,
            "model: %d layers, %d heads, %d embd, vocab %d, block %d: %.2fM parameters | "
            "%s matmuls%s | %d threads\n",
            m->cfg.n_layer, m->cfg.n_head, m->cfg.n_embd, m->cfg.vocab_size, m->cfg.block_size,
            (double)m->n_params / 1e6, m->prec == DT_PREC_BF16 ? "bf16" : "fp32", emulated,
            t->threads);
    fprintf(t->out, "data: %s, %llu tokens (%llu sequences of %d)", dt_dataset_name(t->train),
            (unsigned long long)dt_dataset_ntokens(t->train),
            (unsigned long long)dt_dataset_nseq(t->train, t->r.T), t->r.T);
    if (t->val)
        fprintf(t->out, " | val: %s, %llu tokens", dt_dataset_name(t->val),
                (unsigned long long)dt_dataset_ntokens(t->val));
    fprintf(t->out, "\nbatch: %ld sequences per step = %d per micro-batch x %d accumulation",
            t->global_batch, t->r.B, t->r.accum);
    dt_strategy_describe(&t->S, t->out);
    fprintf(t->out, "\n");
    dt_print_memory(t->out, t->r.world ? "memory of rank 0" : "memory");
}

/* Whether to stop before the next step. Ranks in lockstep agree on it (a
 * signal may reach one of them only), and every later decision uses the
 * agreed value, so their collectives keep matching; asynchronous ranks
 * stop on their own. */
static int stop_requested(trainer *t)
{
    int32_t sig = stop_signal;
    if (t->S.lockstep && dt_allreduce(t->S.lockstep, &sig, &sig, 1, DT_I32, DT_MAX) != 0)
        return 1; /* the communicator failed: the next collective reports it */
    t->stop = sig;
    return sig != 0;
}

static int run_loop(trainer *t)
{
    const dt_train_config *c = t->cfg;
    const double flops_tok = dt_gpt_flops_per_token(&t->model.cfg, t->r.T);
    const double peak = dt_peak_flops(t->threads * t->S.compute_streams,
                                      t->model.prec == DT_PREC_BF16);
    double ms_avg = 0; /* over steps after the first, which pays for kernel generation */
    long averaged = -1;
    while (t->step < c->steps && !stop_requested(t)) {
        uint64_t t0 = dt_now_ns();
        double loss = 0, norm = 0;
        if (train_step(t, &loss, &norm)) return -1;
        double ms = (double)(dt_now_ns() - t0) * 1e-6;
        if (++averaged > 0) ms_avg += (ms - ms_avg) / (double)averaged;
        double tps = (double)t->global_batch * t->r.T / (ms * 1e-3);
        dt_step_stats s = {.step = t->step, .steps = c->steps, .loss = loss, .grad_norm = norm,
                           .lr = dt_config_lr_at(c, t->step), .ms = ms, .tokens_per_s = tps,
                           .mfu = tps * flops_tok / peak,
                           .eta_s = (double)(c->steps - t->step - 1) *
                                    (averaged > 0 ? ms_avg : ms) * 1e-3,
                           .ranks = t->S.dp_size};
        uint64_t bytes;
        dt_strategy_traffic(&t->S, &s.comm_ms, &bytes);
        s.bytes_sent = bytes;
        t->last_loss = loss;
        t->step++;
        t->steps_run++;
        if (c->print_every > 0 && (t->step % c->print_every == 0 || t->step == c->steps))
            dt_print_step(t->out, &s);
        if (t->json) dt_log_json_step(t->json, &s);
        if (!isfinite(loss))
            return dt_strf(ERR(t), "step %ld: the loss is %f: training diverged", t->step, loss),
                   -1;
        int eval_now = c->eval_every > 0 && t->step % c->eval_every == 0 && t->step < c->steps;
        if (eval_now && report_eval(t, 0)) return -1;
        int save_now = c->out_dir[0] && c->save_every > 0 && t->step % c->save_every == 0;
        if (save_now && save_checkpoint(t)) return -1;
    }
    return 0;
}

/* Whether every rank holds the same weights at the end (collective). */
static int check_replicas(trainer *t)
{
    uint64_t hash = 0;
    int same = dt_strategy_replicas_identical(&t->S, &hash);
    if (same < 0) return -1;
    if (same == 0) return dt_strf(ERR(t), "the ranks' weights differ at the end (a bug)"), -1;
    if (same == 1)
        fprintf(t->out, "replicas: %d ranks hold bit-identical weights (hash %016llx)\n",
                t->r.size, (unsigned long long)hash);
    return 0;
}

static int finish(trainer *t)
{
    const dt_train_config *c = t->cfg;
    if (t->stop) fprintf(t->out, "interrupted at step %ld\n", t->step);
    if (dt_strategy_end(&t->S)) return -1;
    /* Save first: a failing evaluation must not cost the trained weights. A
     * process that ran no step has nothing new to save. */
    int saved = c->save_every > 0 && t->step % c->save_every == 0;
    if (c->out_dir[0] && t->steps_run > 0 && !saved && save_checkpoint(t)) return -1;
    if (c->save_final[0] && t->S.writes_checkpoints && (t->steps_run > 0 || !t->stop)) {
        if (dt_weights_save(&t->model, c->save_final, ERR(t))) return -1;
        fprintf(t->out, "weights %s\n", c->save_final);
    }
    if (!t->stop && report_eval(t, 1)) return -1;
    if (dt_strategy_release(&t->S)) return -1;
    if (check_replicas(t)) return -1;
    return print_rank_memory(t, t->r.world ? "peak memory per rank" : "peak memory");
}

/* A rank that serves the others instead of training: it takes part in the
 * final comparison and the memory table when they are done. */
static int serve(trainer *t)
{
    if (dt_strategy_serve(&t->S) || check_replicas(t)) return -1;
    return print_rank_memory(t, "peak memory per rank");
}

/* Opens --log-json. A resumed run keeps the entries of the steps before the
 * checkpoint and drops later ones (steps a crashed run logged but did not
 * save), so the file reads as one run. */
static int open_log(trainer *t, int resuming)
{
    const char *path = t->cfg->log_json;
    if (!path[0]) return 0;
    if (strcmp(path, "-") == 0) {
        t->json = stdout;
        return 0;
    }
    char *kept = NULL;
    size_t kept_len = 0;
    FILE *old = resuming ? fopen(path, "r") : NULL;
    if (old) {
        FILE *mem = open_memstream(&kept, &kept_len);
        char line[4096];
        long step;
        while (mem && fgets(line, sizeof line, old))
            if (sscanf(line, "{\"step\":%ld", &step) == 1 && step < t->step) fputs(line, mem);
        if (mem) fclose(mem);
        fclose(old);
    }
    t->json = fopen(path, "w");
    if (t->json && kept) fwrite(kept, 1, kept_len, t->json);
    free(kept);
    if (!t->json) return dt_strf(ERR(t), "--log-json %s: cannot open for writing", path), -1;
    return 0;
}

/* Compute threads per model when not given: the cores shared among the
 * ranks on this host and the models each computes at once. */
static int default_threads(const trainer *t)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long share = (long)(t->r.world ? dt_comm_local_size(t->r.world) : 1) * t->S.compute_streams;
    long n = cores / (share > 0 ? share : 1);
    return n >= 1 ? (int)n : 1;
}

/* The layers of this rank's strategy, from --strategy. */
static int build_strategy(trainer *t)
{
    const dt_strategy_kind *kind = dt_strategy_find(t->cfg->strategy);
    dt_strategy_init(&t->S, &t->r);
    if (!kind) return dt_strf(ERR(t), "--strategy %s: no such strategy", t->cfg->strategy), -1;
    dt_parallel_opts o = dt_config_parallel_opts(t->cfg);
    return kind->build(&t->S, &o);
}

static int setup(trainer *t)
{
    dt_train_config *c = t->cfg;
    t->r.B = c->batch_size;
    t->r.T = c->seq_len;
    t->r.accum = c->grad_accum;
    t->r.batch = fetch_batch;
    t->r.batch_ctx = t;
    t->r.lr_at = lr_at;
    t->r.lr_ctx = c;
    t->r.grad_clip = c->grad_clip;
    t->r.saves = c->out_dir[0] != '\0';
    t->r.resuming = c->resume_flag;
    t->r.model = &t->model;
    t->r.opt = &t->opt;
    t->global_batch = c->train_batch_size;
    if (build_strategy(t)) return -1;
    t->threads = c->threads > 0 ? c->threads : default_threads(t);
    dt_kernels_set_threads(t->threads);
    dt_sampler_init(&t->train_order, c->seed, c->shuffle);
    dt_sampler_init(&t->val_order, c->seed, 0);
    if (check_outputs(t) || open_data(t)) return -1;
    char resume_dir[DT_CONFIG_PATH + 64];
    if (t->r.resuming && dt_ckpt_resolve(c->resume[0] ? c->resume : c->out_dir, resume_dir,
                                         sizeof resume_dir, ERR(t)))
        return -1;
    if (!t->r.resuming && c->out_dir[0] && t->r.rank == 0 && dt_ckpt_exists(c->out_dir))
        return dt_strf(ERR(t),
                       "--out %s already holds checkpoints: add --resume to continue that run, "
                       "or choose another directory",
                       c->out_dir), -1;
    if (setup_model(t, t->r.resuming ? resume_dir : NULL)) return -1;
    /* The header reports the model actually built (sizes may come from a file). */
    c->n_layer = t->model.cfg.n_layer;
    c->n_head = t->model.cfg.n_head;
    c->n_embd = t->model.cfg.n_embd;
    c->vocab_size = t->model.cfg.vocab_size;
    c->block_size = t->model.cfg.block_size;
    c->seq_len = t->r.T;
    return t->r.rank == 0 && !dt_strategy_serves(&t->S) ? open_log(t, t->r.resuming) : 0;
}

static void teardown(trainer *t)
{
    if (t->json && t->json != stdout) fclose(t->json);
    if (t->out && t->out != stdout && t->out != stderr) fclose(t->out);
    dt_strategy_destroy(&t->S);
    if (t->r.world) dt_comm_destroy(t->r.world);
    free(t->r.inputs);
    free(t->r.targets);
    dt_optimizer_free(&t->opt);
    dt_gpt_destroy(&t->model);
    dt_sampler_free(&t->train_order);
    dt_sampler_free(&t->val_order);
    if (t->train) dt_dataset_close(t->train);
    if (t->val) dt_dataset_close(t->val);
}

static int force_algo(void *comm, const char *coll, const char *algo, char *err, size_t n)
{
    if (dt_comm_set_algo(comm, coll, algo) == 0) return 0;
    return dt_strf(err, n, "--comm-algo: %s", dt_comm_error(comm)), -1;
}

/* Joins the job's communicator when launched as one of several ranks. */
static int join_job(trainer *t, char *err, size_t errlen)
{
    dt_bootstrap b;
    t->r.size = 1;
    if (dt_bootstrap_from_env(&b, err, errlen) != 0) return -1;
    if (b.size <= 1) return 0;
    if (dt_comm_init(&t->r.world) != 0)
        return dt_strf(err, errlen, "joining the job: %s", dt_last_error()), -1;
    t->r.rank = dt_comm_rank(t->r.world);
    t->r.size = dt_comm_size(t->r.world);
    dt_log_set_rank(t->r.rank);
    /* Communicators split from this one inherit its algorithms. */
    return dt_config_each_comm_algo(t->cfg->comm_algo, force_algo, t->r.world, err, errlen);
}

/* Rank 0 speaks for the job unless every rank is asked to. With the JSON
 * log on stdout, the human-readable lines go to stderr. */
static void choose_output(trainer *t)
{
    t->out = strcmp(t->cfg->log_json, "-") == 0 ? stderr : stdout;
    if (t->r.rank != 0 && strcmp(t->cfg->log_ranks, "all") != 0) {
        FILE *quiet = fopen("/dev/null", "w");
        if (quiet) t->out = quiet;
    }
}

int dt_train(dt_train_config *cfg, char *err, size_t errlen)
{
    trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    if (join_job(&t, err, errlen) ||
        dt_config_data_parallel_size(cfg, t.r.size, &t.dp_size, err, errlen) ||
        dt_config_validate(cfg, t.dp_size, err, errlen)) {
        if (t.r.world) dt_comm_destroy(t.r.world);
        return -1;
    }
    choose_output(&t);
    stop_signal = 0;
    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler = on_interrupt;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    int rc = setup(&t);
    if (rc == 0 && dt_strategy_serves(&t.S)) {
        rc = serve(&t);
    } else if (rc == 0) {
        print_header(&t);
        rc = run_loop(&t);
        if (rc == 0) rc = finish(&t);
    }
    if (rc) dt_strf(err, errlen, "%s", t.r.err);
    /* The other ranks may wait in a collective for this one: stop them. */
    if (rc && t.r.world) dt_comm_abort(t.r.world, t.r.err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    teardown(&t);
    if (rc == 0 && t.stop) {
        dt_strf(err, errlen, "interrupted by signal %d", t.stop);
        return 128 + t.stop;
    }
    return rc;
}
