/* The training loop, in one process or as one rank of a data-parallel job.
 * See trainer.h.
 *
 * Step s trains on the global batch of G sequences whose counters are
 * s*G .. s*G+G-1 (sampler.h maps counters to sequences); rank r takes the
 * r-th block of B * accum of them, and its micro-batch j the j-th block of
 * B within that. The logged loss of step s is the mean over the global
 * batch, before the update. */
#include "train/trainer.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/str.h"
#include "core/timer.h"
#include "kernels/optimizer.h"
#include "kernels/threads.h"
#include "comm/bootstrap.h"
#include "dtrain/comm.h"
#include "model/gpt.h"
#include "parallel/ddp.h"
#include "train/checkpoint.h"
#include "train/corpus.h"
#include "train/dataset.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/weights.h"

typedef struct {
    dt_train_config *cfg;
    dt_gpt model;
    dt_optimizer opt;
    dt_dataset *train, *val;
    dt_sampler train_order, val_order;
    int32_t *inputs, *targets; /* one micro-batch, B x T each */
    int B, T, accum, threads;
    long global_batch;         /* sequences per optimizer step */
    long step;                 /* next optimizer step to run */
    long steps_run;            /* steps run by this process */
    uint64_t seq_counter;      /* training sequences consumed */
    double last_loss;
    FILE *json;                /* --log-json, or NULL */
    FILE *out;                 /* human-readable lines (rank 0's; /dev/null elsewhere) */
    /* Data parallelism: comm is NULL in a single process. */
    dt_comm *comm;
    int rank, world;
    dt_ddp ddp;
    char err[512];
} trainer;

/* The first SIGINT or SIGTERM asks the loop to stop after the current step
 * and save; the handler is installed with SA_RESETHAND, so a second one
 * kills the process at once. */
static volatile sig_atomic_t stop_signal;

static void on_interrupt(int sig) { stop_signal = sig; }

/* ---- data --------------------------------------------------------------- */

static int open_data(trainer *t)
{
    const dt_train_config *c = t->cfg;
    char train_path[DT_CONFIG_PATH], val_path[DT_CONFIG_PATH];
    const char *train_file = c->data, *val_file = c->val_data;
    if (!c->data[0]) {
        if (dt_default_corpus(train_path, val_path, sizeof train_path, t->err, sizeof t->err))
            return -1;
        train_file = train_path;
        if (!c->val_data[0]) val_file = val_path;
    }
    dt_dataset *all;
    if (dt_dataset_open(train_file, &all, t->err, sizeof t->err)) return -1;
    if (val_file[0]) {
        t->train = all;
        return dt_dataset_open(val_file, &t->val, t->err, sizeof t->err);
    }
    if (c->val_fraction <= 0 || c->eval_batches == 0) {
        t->train = all;
        return 0;
    }
    int rc = dt_dataset_split(all, c->val_fraction, &t->train, &t->val, t->err, sizeof t->err);
    dt_dataset_close(all);
    return rc;
}

/* ---- the model's sizes ---------------------------------------------------- */

/* Sizes given explicitly must match the ones a weights file implies. */
static int check_sizes_agree(trainer *t, const char *source, const dt_gpt_config *mc)
{
    const dt_train_config *c = t->cfg;
    const struct { const char *name; int given, want, have; } s[] = {
        {"n_layer", DT_CONFIG_GIVEN(c, n_layer), c->n_layer, mc->n_layer},
        {"n_head", DT_CONFIG_GIVEN(c, n_head), c->n_head, mc->n_head},
        {"n_embd", DT_CONFIG_GIVEN(c, n_embd), c->n_embd, mc->n_embd},
        {"vocab_size", DT_CONFIG_GIVEN(c, vocab_size), c->vocab_size, mc->vocab_size},
        {"block_size", DT_CONFIG_GIVEN(c, block_size), c->block_size, mc->block_size},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        if (s[i].given && s[i].want != s[i].have) {
            dt_strf(t->err, sizeof t->err, "%s has %s %d, but %d was asked for", source,
                    s[i].name, s[i].have, s[i].want);
            return -1;
        }
    }
    return 0;
}

/* Sizes come from a checkpoint being resumed, else from --init, else from
 * the config (vocabulary from the data when not given). */
static int resolve_model_config(trainer *t, const char *resume_dir, dt_gpt_config *mc)
{
    const dt_train_config *c = t->cfg;
    if (resume_dir || c->init[0]) {
        int rc = resume_dir ? dt_ckpt_model_config(resume_dir, mc, t->err, sizeof t->err)
                            : dt_weights_inspect(c->init, mc, t->err, sizeof t->err);
        if (rc) return -1;
        if (mc->n_head == 0) {
            /* Shapes do not give the head count, and a wrong one still runs. */
            if (!DT_CONFIG_GIVEN(c, n_head) && !DT_CONFIG_GIVEN(c, model)) {
                dt_strf(t->err, sizeof t->err,
                        "%s records no n_head (no metadata, no config.json beside it): "
                        "give --n-head",
                        resume_dir ? resume_dir : c->init);
                return -1;
            }
            mc->n_head = c->n_head;
        }
        if (check_sizes_agree(t, resume_dir ? resume_dir : c->init, mc)) return -1;
        /* Sequences fill the file's context unless a length was asked for. */
        if (!DT_CONFIG_GIVEN(c, seq_len)) t->T = mc->block_size;
    } else {
        mc->n_layer = c->n_layer;
        mc->n_head = c->n_head;
        mc->n_embd = c->n_embd;
        mc->block_size = c->block_size;
        /* Byte-level data gets the full byte vocabulary, so any text can be sampled. */
        int data_vocab = dt_dataset_vocab(t->train);
        mc->vocab_size = c->vocab_size > 0 ? c->vocab_size : data_vocab <= 256 ? 256 : data_vocab;
    }
    int need = dt_dataset_vocab(t->train);
    if (t->val && dt_dataset_vocab(t->val) > need) need = dt_dataset_vocab(t->val);
    if (need > mc->vocab_size) {
        dt_strf(t->err, sizeof t->err,
                "%s holds token %d, outside the model's vocabulary of %d (set --vocab-size)",
                dt_dataset_name(t->train), need - 1, mc->vocab_size);
        return -1;
    }
    if (t->T > mc->block_size) {
        dt_strf(t->err, sizeof t->err, "--seq-len %d exceeds the model's block_size %d", t->T,
                mc->block_size);
        return -1;
    }
    return dt_gpt_config_check(mc, t->err, sizeof t->err);
}

static int setup_model(trainer *t, const char *resume_dir)
{
    const dt_train_config *c = t->cfg;
    dt_gpt_config mc;
    if (resolve_model_config(t, resume_dir, &mc)) return -1;
    dt_precision prec = strcmp(c->dtype, "bf16") == 0 ? DT_PREC_BF16 : DT_PREC_F32;
    if (dt_gpt_create(&t->model, &mc, prec, t->err, sizeof t->err)) return -1;
    if (dt_gpt_alloc_grads(&t->model) || dt_gpt_alloc_acts(&t->model, t->B, t->T)) {
        dt_strf(t->err, sizeof t->err, "%s", t->model.error);
        return -1;
    }
    dt_opt_kind kind;
    if (dt_opt_kind_parse(c->optimizer, &kind) ||
        dt_optimizer_init(&t->opt, kind, t->model.n_floats, c->beta1, c->beta2, c->eps,
                          c->weight_decay, c->momentum)) {
        dt_strf(t->err, sizeof t->err, "optimizer %s: cannot set up its state", c->optimizer);
        return -1;
    }
    t->inputs = malloc((size_t)t->B * t->T * sizeof(int32_t));
    t->targets = malloc((size_t)t->B * t->T * sizeof(int32_t));
    if (!t->inputs || !t->targets) {
        dt_strf(t->err, sizeof t->err, "out of memory for the batch");
        return -1;
    }
    if (resume_dir) return 0;
    if (c->init[0]) return dt_weights_load(&t->model, c->init, t->err, sizeof t->err);
    dt_gpt_init_weights(&t->model, c->seed);
    return 0;
}

static int resume(trainer *t, const char *dir)
{
    dt_ckpt_state st;
    if (dt_ckpt_load(dir, &t->model, &t->opt, &st, t->err, sizeof t->err)) return -1;
    if (st.seq_len != t->T || st.shuffle != t->cfg->shuffle || st.seed != t->cfg->seed) {
        dt_strf(t->err, sizeof t->err,
                "%s: saved with seq_len %d, shuffle %d, seed %llu; this run has %d, %d, %llu "
                "(the data order would differ)",
                dir, st.seq_len, st.shuffle, (unsigned long long)st.seed, t->T, t->cfg->shuffle,
                (unsigned long long)t->cfg->seed);
        return -1;
    }
    uint64_t ntok = dt_dataset_ntokens(t->train);
    if (st.data_tokens != 0 && st.data_tokens != ntok) {
        dt_strf(t->err, sizeof t->err,
                "%s: trained on %llu tokens of data, this run has %llu (%s): other data would "
                "break the data order",
                dir, (unsigned long long)st.data_tokens, (unsigned long long)ntok,
                dt_dataset_name(t->train));
        return -1;
    }
    if (st.global_batch != t->global_batch)
        DT_WARN("%s: global batch was %ld sequences, now %ld", dir, st.global_batch,
                t->global_batch);
    t->step = st.step;
    t->seq_counter = st.seq_counter;
    t->last_loss = st.last_loss;
    fprintf(t->out, "resumed from %s at step %ld\n", dir, t->step);
    return 0;
}

/* ---- one optimizer step --------------------------------------------------- */

static int comm_failed(trainer *t, const char *what)
{
    dt_strf(t->err, sizeof t->err, "%s: %s", what, dt_comm_error(t->comm));
    return -1;
}

/* The mean of a value over ranks (the value itself in one process). */
static int mean_over_ranks(trainer *t, double *v)
{
    if (!t->comm) return 0;
    return dt_allreduce(t->comm, v, v, 1, DT_F64, DT_AVG) ? comm_failed(t, "loss") : 0;
}

static int train_step(trainer *t, double *loss_out, double *norm_out)
{
    dt_gpt *m = &t->model;
    const float grad_scale = 1.0f / ((float)t->B * (float)t->T * (float)t->accum);
    const uint64_t mine = t->seq_counter + (uint64_t)t->rank * t->B * t->accum;
    double loss_sum = 0;
    memset(m->grads, 0, m->n_floats * sizeof(float));
    for (int j = 0; j < t->accum; j++) {
        if (dt_dataset_batch(t->train, &t->train_order, mine + (uint64_t)j * t->B, t->B, t->T,
                             t->inputs, t->targets, t->err, sizeof t->err))
            return -1;
        double loss = dt_gpt_forward(m, t->inputs, t->targets, t->B, t->T);
        /* Only the last micro-batch's backward reduces the accumulated gradients. */
        if (t->comm) dt_ddp_begin_backward(&t->ddp, j == t->accum - 1);
        if (loss < 0 || dt_gpt_backward(m, t->inputs, t->B, t->T, grad_scale)) {
            dt_strf(t->err, sizeof t->err, "%s", m->error);
            return -1;
        }
        loss_sum += loss;
    }
    if (t->comm && dt_ddp_finish(&t->ddp)) return comm_failed(t, "gradient all-reduce");
    double loss_mean = loss_sum / t->accum;
    if (mean_over_ranks(t, &loss_mean)) return -1;
    double norm = sqrt(dt_sum_squares(m->grads, m->n_floats));
    if (!isfinite(norm)) {
        dt_strf(t->err, sizeof t->err,
                "step %ld: the gradient norm is %f; stopping before the update (the weights "
                "and the last checkpoint are untouched)",
                t->step + 1, norm);
        return -1;
    }
    float coef = dt_clip_coef(norm, t->cfg->grad_clip);
    double lr = dt_config_lr_at(t->cfg, t->step);
    dt_optimizer_step(&t->opt, m, m->params, m->grads, 0, m->n_floats, lr, coef);
    t->seq_counter += (uint64_t)t->global_batch;
    *loss_out = loss_mean;
    *norm_out = norm;
    return 0;
}

/* Mean loss over up to eval_batches micro-batches of the validation data,
 * always the same sequences (the first ones, in order). */
static int evaluate(trainer *t, double *loss_out)
{
    uint64_t nseq = dt_dataset_nseq(t->val, t->T);
    uint64_t want = (uint64_t)t->cfg->eval_batches * (uint64_t)t->B;
    uint64_t total = want < nseq ? want : nseq;
    double sum[1] = {0};
    /* Rank r evaluates micro-batches r, r + world, ...; the sums are added. */
    uint64_t stride = (uint64_t)t->B * (uint64_t)t->world;
    for (uint64_t first = (uint64_t)t->rank * t->B; first < total; first += stride) {
        int b = (int)(total - first < (uint64_t)t->B ? total - first : (uint64_t)t->B);
        if (dt_dataset_batch(t->val, &t->val_order, first, b, t->T, t->inputs, t->targets, t->err,
                             sizeof t->err))
            return -1;
        double loss = dt_gpt_forward(&t->model, t->inputs, t->targets, b, t->T);
        if (loss < 0) {
            dt_strf(t->err, sizeof t->err, "%s", t->model.error);
            return -1;
        }
        sum[0] += loss * b;
    }
    if (t->comm && dt_allreduce(t->comm, sum, sum, 1, DT_F64, DT_SUM))
        return comm_failed(t, "evaluation");
    *loss_out = sum[0] / (double)total;
    return 0;
}

static int report_eval(trainer *t)
{
    if (!t->val || t->cfg->eval_batches == 0) return 0;
    if (dt_dataset_check(t->val, t->T, t->err, sizeof t->err)) return -1;
    double loss;
    if (evaluate(t, &loss)) return -1;
    fprintf(t->out, "val loss %.4f (step %ld)\n", loss, t->step);
    if (t->json) fprintf(t->json, "{\"step\":%ld,\"val_loss\":%.9g}\n", t->step - 1, loss);
    return 0;
}

static int save_checkpoint(trainer *t)
{
    if (t->rank != 0) return 0; /* replicas: rank 0 writes for the job */
    dt_ckpt_state st = {.step = t->step,
                        .seq_counter = t->seq_counter,
                        .seed = t->cfg->seed,
                        .shuffle = t->cfg->shuffle,
                        .seq_len = t->T,
                        .global_batch = t->global_batch,
                        .last_loss = t->last_loss,
                        .data_tokens = dt_dataset_ntokens(t->train)};
    char path[DT_CONFIG_PATH + 64];
    if (dt_ckpt_save(t->cfg->out_dir, &t->model, &t->opt, &st, t->cfg->keep_last, path,
                     sizeof path, t->err, sizeof t->err))
        return -1;
    fprintf(t->out, "checkpoint %s\n", path);
    return 0;
}

/* ---- the loop ------------------------------------------------------------- */

static void print_header(trainer *t)
{
    const dt_gpt *m = &t->model;
    dt_config_print(t->cfg, t->out);
    fprintf(t->out,
            "model: %d layers, %d heads, %d embd, vocab %d, block %d: %.2fM parameters | "
            "%s matmuls | %d threads\n",
            m->cfg.n_layer, m->cfg.n_head, m->cfg.n_embd, m->cfg.vocab_size, m->cfg.block_size,
            (double)m->n_params / 1e6, m->prec == DT_PREC_BF16 ? "bf16" : "fp32", t->threads);
    fprintf(t->out, "data: %s, %llu tokens (%llu sequences of %d)", dt_dataset_name(t->train),
            (unsigned long long)dt_dataset_ntokens(t->train),
            (unsigned long long)dt_dataset_nseq(t->train, t->T), t->T);
    if (t->val)
        fprintf(t->out, " | val: %s, %llu tokens", dt_dataset_name(t->val),
                (unsigned long long)dt_dataset_ntokens(t->val));
    fprintf(t->out, "\nbatch: %ld sequences per step = %d per micro-batch x %d accumulation",
            t->global_batch, t->B, t->accum);
    if (t->comm)
        fprintf(t->out, " x %d ranks (DDP over %s, %d buckets of ~%g MiB)", t->world,
                dt_comm_transport(t->comm), t->ddp.nbuckets, t->cfg->bucket_mb);
    fprintf(t->out, "\n");
    dt_print_memory(t->out, t->comm ? "memory per rank" : "memory");
}

/* Whether to stop before the next step. Ranks agree (a signal may reach
 * one of them only), or their collectives would stop matching. */
static int stop_requested(trainer *t)
{
    int32_t stop = stop_signal ? 1 : 0;
    if (t->comm && dt_allreduce(t->comm, &stop, &stop, 1, DT_I32, DT_MAX) != 0) return 1;
    return stop;
}

static int run_loop(trainer *t)
{
    const dt_train_config *c = t->cfg;
    const double flops_tok = dt_gpt_flops_per_token(&t->model.cfg, t->T);
    const double peak = dt_peak_flops(t->threads * t->world, t->model.prec == DT_PREC_BF16);
    double ms_avg = 0; /* over steps after the first, which pays for kernel generation */
    long averaged = -1;
    while (t->step < c->steps && !stop_requested(t)) {
        uint64_t t0 = dt_now_ns();
        double loss, norm;
        if (train_step(t, &loss, &norm)) return -1;
        double ms = (double)(dt_now_ns() - t0) * 1e-6;
        if (++averaged > 0) ms_avg += (ms - ms_avg) / (double)averaged;
        double tps = (double)t->global_batch * t->T / (ms * 1e-3);
        dt_step_stats s = {.step = t->step, .steps = c->steps, .loss = loss, .grad_norm = norm,
                           .lr = dt_config_lr_at(c, t->step), .ms = ms, .tokens_per_s = tps,
                           .mfu = tps * flops_tok / peak,
                           .eta_s = (double)(c->steps - t->step - 1) *
                                    (averaged > 0 ? ms_avg : ms) * 1e-3,
                           .ranks = t->world,
                           .comm_ms = t->comm ? t->ddp.wait_ms : 0,
                           .bytes_sent = t->comm ? t->ddp.bytes_sent : 0};
        t->last_loss = loss;
        t->step++;
        t->steps_run++;
        if (c->print_every > 0 && (t->step % c->print_every == 0 || t->step == c->steps))
            dt_print_step(t->out, &s);
        if (t->json) dt_log_json_step(t->json, &s);
        if (!isfinite(loss)) {
            dt_strf(t->err, sizeof t->err, "step %ld: the loss is %f: training diverged",
                    t->step, loss);
            return -1;
        }
        int eval_now = c->eval_every > 0 && t->step % c->eval_every == 0 && t->step < c->steps;
        if (eval_now && report_eval(t)) return -1;
        int save_now = c->out_dir[0] && c->save_every > 0 && t->step % c->save_every == 0;
        if (save_now && save_checkpoint(t)) return -1;
    }
    return 0;
}

static int finish(trainer *t)
{
    const dt_train_config *c = t->cfg;
    if (stop_signal) fprintf(t->out, "interrupted at step %ld\n", t->step);
    /* Save first: a failing evaluation must not cost the trained weights. A
     * process that ran no step has nothing new to save. */
    int saved = c->save_every > 0 && t->step % c->save_every == 0;
    if (c->out_dir[0] && t->steps_run > 0 && !saved && save_checkpoint(t)) return -1;
    if (c->save_final[0] && (t->steps_run > 0 || !stop_signal)) {
        if (dt_weights_save(&t->model, c->save_final, t->err, sizeof t->err)) return -1;
        fprintf(t->out, "weights %s\n", c->save_final);
    }
    if (!stop_signal && report_eval(t)) return -1;
    if (t->comm) {
        uint64_t hash;
        int same = dt_ddp_replicas_identical(&t->ddp, &hash);
        if (same < 0) return comm_failed(t, "comparing replicas");
        if (!same) {
            dt_strf(t->err, sizeof t->err, "the ranks' weights differ at the end (a bug)");
            return -1;
        }
        fprintf(t->out, "replicas: %d ranks hold bit-identical weights (hash %016llx)\n",
                t->world, (unsigned long long)hash);
    }
    dt_print_memory(t->out, t->comm ? "memory per rank at the end" : "memory at the end");
    return 0;
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
    if (!t->json) {
        dt_strf(t->err, sizeof t->err, "--log-json %s: cannot open for writing", path);
        return -1;
    }
    return 0;
}

/* Every rank starts from rank 0's weights and checks that it holds them. */
static int setup_ddp(trainer *t)
{
    int rc = dt_ddp_init(&t->ddp, t->comm, &t->model,
                         (size_t)(t->cfg->bucket_mb * 1048576.0));
    if (rc == 0) rc = dt_ddp_broadcast_params(&t->ddp);
    if (rc != 0) return comm_failed(t, "DDP setup");
    int same = dt_ddp_replicas_identical(&t->ddp, NULL);
    if (same < 0) return comm_failed(t, "DDP setup");
    if (!same) {
        dt_strf(t->err, sizeof t->err, "after the broadcast the ranks' weights differ");
        return -1;
    }
    return 0;
}

static int setup(trainer *t)
{
    dt_train_config *c = t->cfg;
    t->B = c->batch_size;
    t->T = c->seq_len;
    t->accum = c->grad_accum;
    t->global_batch = c->train_batch_size;
    t->threads = c->threads > 0 ? c->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    dt_kernels_set_threads(t->threads);
    dt_sampler_init(&t->train_order, c->seed, c->shuffle);
    dt_sampler_init(&t->val_order, c->seed, 0);
    if (open_data(t)) return -1;
    char resume_dir[DT_CONFIG_PATH + 64];
    int resuming = c->resume_flag;
    if (resuming && dt_ckpt_resolve(c->resume[0] ? c->resume : c->out_dir, resume_dir,
                                    sizeof resume_dir, t->err, sizeof t->err))
        return -1;
    if (!resuming && c->out_dir[0] && t->rank == 0 && dt_ckpt_exists(c->out_dir)) {
        dt_strf(t->err, sizeof t->err,
                "--out %s already holds checkpoints: add --resume to continue that run, or "
                "choose another directory",
                c->out_dir);
        return -1;
    }
    if (setup_model(t, resuming ? resume_dir : NULL)) return -1;
    if (dt_dataset_check(t->train, t->T, t->err, sizeof t->err)) return -1;
    /* Validation data too short for one sequence would fail only at the end. */
    if (t->val && c->eval_batches > 0 && dt_dataset_check(t->val, t->T, t->err, sizeof t->err))
        return -1;
    if (resuming && resume(t, resume_dir)) return -1;
    if (t->comm && setup_ddp(t)) return -1;
    /* The header reports the model actually built (sizes may come from a file). */
    c->n_layer = t->model.cfg.n_layer;
    c->n_head = t->model.cfg.n_head;
    c->n_embd = t->model.cfg.n_embd;
    c->vocab_size = t->model.cfg.vocab_size;
    c->block_size = t->model.cfg.block_size;
    c->seq_len = t->T;
    return t->rank == 0 ? open_log(t, resuming) : 0;
}

static void teardown(trainer *t)
{
    if (t->json && t->json != stdout) fclose(t->json);
    if (t->out && t->out != stdout && t->out != stderr) fclose(t->out);
    if (t->comm) {
        dt_ddp_free(&t->ddp);
        dt_comm_destroy(t->comm);
    }
    free(t->inputs);
    free(t->targets);
    dt_optimizer_free(&t->opt);
    dt_gpt_destroy(&t->model);
    dt_sampler_free(&t->train_order);
    dt_sampler_free(&t->val_order);
    if (t->train) dt_dataset_close(t->train);
    if (t->val) dt_dataset_close(t->val);
}

/* Joins the job's communicator when launched as one of several ranks. */
static int join_job(trainer *t, char *err, size_t errlen)
{
    dt_bootstrap b;
    t->world = 1;
    if (dt_bootstrap_from_env(&b, err, errlen) != 0) return -1;
    if (b.size <= 1) return 0;
    if (dt_comm_init(&t->comm) != 0) {
        dt_strf(err, errlen, "joining the job: %s", dt_last_error());
        return -1;
    }
    t->rank = dt_comm_rank(t->comm);
    t->world = dt_comm_size(t->comm);
    dt_log_set_rank(t->rank);
    return 0;
}

int dt_train(dt_train_config *cfg, char *err, size_t errlen)
{
    trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    if (join_job(&t, err, errlen) || dt_config_validate(cfg, t.world, err, errlen)) {
        if (t.comm) dt_comm_destroy(t.comm);
        return -1;
    }
    /* Rank 0 speaks for the job. With the JSON log on stdout, the
     * human-readable lines go to stderr. */
    t.out = strcmp(cfg->log_json, "-") == 0 ? stderr : stdout;
    if (t.rank != 0) {
        FILE *quiet = fopen("/dev/null", "w");
        if (quiet) t.out = quiet;
    }
    stop_signal = 0;
    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler = on_interrupt;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    int rc = setup(&t);
    if (rc == 0) {
        print_header(&t);
        rc = run_loop(&t);
    }
    if (rc == 0) rc = finish(&t);
    if (rc) dt_strf(err, errlen, "%s", t.err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    teardown(&t);
    if (rc == 0 && stop_signal) {
        dt_strf(err, errlen, "interrupted by signal %d", (int)stop_signal);
        return 128 + stop_signal;
    }
    return rc;
}
