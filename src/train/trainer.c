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
#include "parallel/naive_dp.h"
#include "parallel/ps_server.h"
#include "parallel/ps_worker.h"
#include "train/checkpoint.h"
#include "train/corpus.h"
#include "train/dataset.h"
#include "train/metrics.h"
#include "model/optimizer.h"
#include "train/weights.h"

typedef enum {
    STRAT_SINGLE,    /* one process, one device */
    STRAT_DDP,       /* ranks all-reduce their gradients */
    STRAT_DP,        /* one process, devices as threads */
    STRAT_PS_WORKER, /* parameter server: this rank computes gradients */
    STRAT_PS_SERVER  /* parameter server: this rank holds a shard */
} strategy;

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
    /* Data parallelism. comm is the job's (NULL in one process); rank 0
     * speaks for the job. The data-parallel group is the ranks that share
     * each batch: all of them with DDP, the workers with a parameter
     * server; dp_comm reduces over it when its members move in lockstep. */
    strategy strat;
    dt_comm *comm;
    int rank, world;
    dt_comm *dp_comm;
    int dp_index, dp_size; /* this rank's block of each batch, and the number of blocks */
    dt_ddp ddp;
    dt_naive_dp ndp;
    dt_ps ps;
    dt_ps_worker psw;
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

/* Optimizer state for n floats (the whole layout, or a server's shard). */
static int init_optimizer(trainer *t, size_t n)
{
    const dt_train_config *c = t->cfg;
    dt_opt_kind kind;
    if (dt_opt_kind_parse(c->optimizer, &kind) ||
        dt_optimizer_init(&t->opt, kind, n, c->beta1, c->beta2, c->eps, c->weight_decay,
                          c->momentum)) {
        dt_strf(t->err, sizeof t->err, "optimizer %s: cannot set up its state", c->optimizer);
        return -1;
    }
    return 0;
}

/* The model with its gradients and activations, the optimizer when this
 * rank updates or stages checkpoints (with_optimizer), the batch buffers,
 * and the starting weights. */
static int setup_model(trainer *t, const char *resume_dir, int with_optimizer)
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
    if (with_optimizer && init_optimizer(t, t->model.n_floats)) return -1;
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

/* A parameter-server worker other than rank 0 takes its starting state
 * from the servers; rank 0 keeps the optimizer only to stage checkpoints. */
static int worker_needs_optimizer(const trainer *t, int resuming)
{
    return resuming || (t->rank == 0 && t->cfg->out_dir[0]);
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

static int failed_on(trainer *t, dt_comm *c, const char *what)
{
    dt_strf(t->err, sizeof t->err, "%s: %s", what, dt_comm_error(c));
    return -1;
}

static int comm_failed(trainer *t, const char *what) { return failed_on(t, t->comm, what); }

/* The mean of a value over the data-parallel group when it moves in
 * lockstep; otherwise (one process, asynchronous workers) this rank's own. */
static int mean_over_ranks(trainer *t, double *v)
{
    if (!t->dp_comm) return 0;
    return dt_allreduce(t->dp_comm, v, v, 1, DT_F64, DT_AVG) ? failed_on(t, t->dp_comm, "loss")
                                                             : 0;
}

/* This rank's share of a step: its micro-batches, gradients accumulated
 * and scaled to the mean over them; the last backward communicates. */
static int local_grads(trainer *t, double *loss_out)
{
    dt_gpt *m = &t->model;
    const float grad_scale = 1.0f / ((float)t->B * (float)t->T * (float)t->accum);
    const uint64_t mine = t->seq_counter + (uint64_t)t->dp_index * t->B * t->accum;
    double loss_sum = 0;
    memset(m->grads, 0, m->n_floats * sizeof(float));
    for (int j = 0; j < t->accum; j++) {
        if (dt_dataset_batch(t->train, &t->train_order, mine + (uint64_t)j * t->B, t->B, t->T,
                             t->inputs, t->targets, t->err, sizeof t->err))
            return -1;
        double loss = dt_gpt_forward(m, t->inputs, t->targets, t->B, t->T);
        int last = j == t->accum - 1;
        if (t->strat == STRAT_DDP) dt_ddp_begin_backward(&t->ddp, last);
        if (t->strat == STRAT_PS_WORKER) dt_ps_worker_begin_backward(&t->psw, last);
        if (loss < 0 || dt_gpt_backward(m, t->inputs, t->B, t->T, grad_scale)) {
            dt_strf(t->err, sizeof t->err, "%s", m->error);
            return -1;
        }
        loss_sum += loss;
    }
    *loss_out = loss_sum / t->accum;
    return 0;
}

/* Naive data parallelism: the main device scatters each device its block
 * of the batch (the block a rank would take), then the devices run. The
 * scale makes the gathered sum the mean over the global batch. */
static int device_grads(trainer *t, double *loss_out)
{
    dt_naive_dp *d = &t->ndp;
    for (int dev = 0; dev < d->ndev; dev++) {
        uint64_t first = t->seq_counter + (uint64_t)dev * t->B * t->accum;
        for (int j = 0; j < t->accum; j++)
            if (dt_dataset_batch(t->train, &t->train_order, first + (uint64_t)j * t->B, t->B,
                                 t->T, dt_naive_dp_inputs(d, dev, j),
                                 dt_naive_dp_targets(d, dev, j), t->err, sizeof t->err))
                return -1;
    }
    float scale = 1.0f / ((float)t->B * (float)t->T * (float)t->accum * (float)d->ndev);
    return dt_naive_dp_step(d, scale, loss_out, t->err, sizeof t->err);
}

/* The gradients of the global batch everywhere they are needed: averaged
 * on every rank (DDP), or on the main device (dp); a parameter-server
 * worker instead ends with the servers' updated parameters. */
static int exchange_grads(trainer *t)
{
    if (t->strat == STRAT_DDP && dt_ddp_finish(&t->ddp))
        return comm_failed(t, "gradient all-reduce");
    if (t->strat == STRAT_PS_WORKER && dt_ps_worker_finish(&t->psw))
        return failed_on(t, t->psw.link, "parameter server push and pull");
    return 0;
}

static int train_step(trainer *t, double *loss_out, double *norm_out)
{
    dt_gpt *m = &t->model;
    double loss;
    if (t->strat == STRAT_PS_WORKER && dt_ps_worker_begin_step(&t->psw, t->step))
        return failed_on(t, t->psw.link, "parameter server step");
    int rc = t->strat == STRAT_DP ? device_grads(t, &loss) : local_grads(t, &loss);
    if (rc || exchange_grads(t) || mean_over_ranks(t, &loss)) return -1;
    int remote = t->strat == STRAT_PS_WORKER; /* the servers clip and update */
    double norm = remote ? t->psw.norm : sqrt(dt_sum_squares(m->grads, m->n_floats));
    if (!isfinite(norm)) {
        dt_strf(t->err, sizeof t->err,
                "step %ld: the gradient norm is %f; stopping before the update (the weights "
                "and the last checkpoint are untouched)",
                t->step + 1, norm);
        return -1;
    }
    if (!remote) {
        float coef = dt_clip_coef(norm, t->cfg->grad_clip);
        double lr = dt_config_lr_at(t->cfg, t->step);
        dt_optimizer_step(&t->opt, m, m->params, m->grads, 0, m->n_floats, lr, coef);
    }
    t->seq_counter += (uint64_t)t->global_batch;
    *loss_out = loss;
    *norm_out = norm;
    return 0;
}

/* Mean loss over up to eval_batches micro-batches of the validation data,
 * always the same sequences (the first ones, in order), split over the
 * ranks of comm (NULL: this rank alone). */
static int evaluate(trainer *t, dt_comm *comm, double *loss_out)
{
    uint64_t nseq = dt_dataset_nseq(t->val, t->T);
    uint64_t want = (uint64_t)t->cfg->eval_batches * (uint64_t)t->B;
    uint64_t total = want < nseq ? want : nseq;
    uint64_t index = comm ? (uint64_t)dt_comm_rank(comm) : 0;
    uint64_t size = comm ? (uint64_t)dt_comm_size(comm) : 1;
    double sum[1] = {0};
    /* Rank r evaluates micro-batches r, r + size, ...; the sums are added. */
    for (uint64_t first = index * t->B; first < total; first += (uint64_t)t->B * size) {
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
    if (comm && dt_allreduce(comm, sum, sum, 1, DT_F64, DT_SUM))
        return failed_on(t, comm, "evaluation");
    *loss_out = sum[0] / (double)total;
    return 0;
}

/* Asynchronous workers hold different parameters during training: rank 0
 * evaluates its own alone then. At the end they all hold the same. */
static int report_eval(trainer *t, int final)
{
    if (!t->val || t->cfg->eval_batches == 0) return 0;
    dt_comm *comm = t->dp_comm;
    if (t->strat == STRAT_PS_WORKER && !comm) {
        if (final) comm = t->ps.role;
        else if (t->rank != 0) return 0;
    }
    if (dt_dataset_check(t->val, t->T, t->err, sizeof t->err)) return -1;
    double loss = 0;
    if (evaluate(t, comm, &loss)) return -1;
    fprintf(t->out, "val loss %.4f (step %ld)\n", loss, t->step);
    if (t->json) fprintf(t->json, "{\"step\":%ld,\"val_loss\":%.9g}\n", t->step - 1, loss);
    return 0;
}

static int save_checkpoint(trainer *t)
{
    if (t->rank != 0) return 0; /* replicas: rank 0 writes for the job */
    /* The optimizer state lives on the servers: rank 0 gathers it. */
    if (t->strat == STRAT_PS_WORKER && dt_ps_worker_fetch(&t->psw, &t->opt))
        return failed_on(t, t->psw.link, "fetching the servers' state for a checkpoint");
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

static void print_strategy(trainer *t)
{
    const dt_train_config *c = t->cfg;
    switch (t->strat) {
    case STRAT_DDP:
        fprintf(t->out, " x %d ranks (DDP over %s, %d buckets of ~%g MiB)", t->world,
                dt_comm_transport(t->comm), t->ddp.nbuckets, c->bucket_mb);
        break;
    case STRAT_DP:
        fprintf(t->out, " x %d devices (naive data parallelism: threads, device 0 is the main one)",
                t->ndp.ndev);
        break;
    case STRAT_PS_WORKER:
        fprintf(t->out, " x %d workers (parameter server over %s: %d server%s, %s", t->ps.workers,
                dt_comm_transport(t->comm), t->ps.servers, t->ps.servers > 1 ? "s" : "",
                c->ps_mode);
        if (t->ps.async) fprintf(t->out, " with staleness %d", t->ps.staleness);
        fprintf(t->out, ", %d pieces per push, compression %s)", t->ps.npieces, c->compress);
        break;
    default: break;
    }
}

/* Every rank's memory at its peak, printed by rank 0: the ranks of a
 * parameter server hold very different things. Collective over the job. */
static int print_rank_memory(trainer *t, const char *title)
{
    unsigned long long mine[DT_MEM_SNAPSHOT], *all = NULL;
    dt_memory_snapshot(mine, 1);
    if (!t->comm) {
        dt_print_memory_snapshot(t->out, title, mine);
        return 0;
    }
    if (t->rank == 0 && !(all = malloc((size_t)t->world * sizeof mine))) {
        dt_strf(t->err, sizeof t->err, "out of memory");
        return -1;
    }
    if (dt_gather(t->comm, mine, all, DT_MEM_SNAPSHOT, DT_I64, 0)) {
        free(all);
        return comm_failed(t, "gathering memory use");
    }
    fprintf(t->out, "%s:\n", title);
    for (int r = 0; all && r < t->world; r++) {
        char label[64];
        int server = t->strat == STRAT_PS_WORKER && r >= t->ps.workers;
        dt_strf(label, sizeof label, "  rank %d%s", r, server ? " (server)" : "");
        dt_print_memory_snapshot(t->out, label, all + (size_t)r * DT_MEM_SNAPSHOT);
    }
    free(all);
    return 0;
}

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
    print_strategy(t);
    fprintf(t->out, "\n");
    dt_print_memory(t->out, t->comm ? "memory of rank 0" : "memory");
}

/* Whether to stop before the next step. Ranks in lockstep agree (a signal
 * may reach one of them only), or their collectives would stop matching;
 * asynchronous workers stop on their own. */
static int stop_requested(trainer *t)
{
    int32_t stop = stop_signal ? 1 : 0;
    if (t->dp_comm && dt_allreduce(t->dp_comm, &stop, &stop, 1, DT_I32, DT_MAX) != 0) return 1;
    return stop;
}

/* Communication the step could not hide, and what it moved. */
static void step_traffic(const trainer *t, dt_step_stats *s)
{
    switch (t->strat) {
    case STRAT_DDP: s->comm_ms = t->ddp.wait_ms, s->bytes_sent = t->ddp.bytes_sent; break;
    case STRAT_DP: s->comm_ms = t->ndp.copy_ms, s->bytes_sent = t->ndp.bytes_moved; break;
    case STRAT_PS_WORKER: s->comm_ms = t->psw.wait_ms, s->bytes_sent = t->psw.bytes_sent; break;
    default: break;
    }
}

static int run_loop(trainer *t)
{
    const dt_train_config *c = t->cfg;
    const double flops_tok = dt_gpt_flops_per_token(&t->model.cfg, t->T);
    const double peak = dt_peak_flops(t->threads * t->dp_size, t->model.prec == DT_PREC_BF16);
    double ms_avg = 0; /* over steps after the first, which pays for kernel generation */
    long averaged = -1;
    while (t->step < c->steps && !stop_requested(t)) {
        uint64_t t0 = dt_now_ns();
        double loss = 0, norm = 0;
        if (train_step(t, &loss, &norm)) return -1;
        double ms = (double)(dt_now_ns() - t0) * 1e-6;
        if (++averaged > 0) ms_avg += (ms - ms_avg) / (double)averaged;
        double tps = (double)t->global_batch * t->T / (ms * 1e-3);
        dt_step_stats s = {.step = t->step, .steps = c->steps, .loss = loss, .grad_norm = norm,
                           .lr = dt_config_lr_at(c, t->step), .ms = ms, .tokens_per_s = tps,
                           .mfu = tps * flops_tok / peak,
                           .eta_s = (double)(c->steps - t->step - 1) *
                                    (averaged > 0 ? ms_avg : ms) * 1e-3,
                           .ranks = t->dp_size};
        step_traffic(t, &s);
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
        if (eval_now && report_eval(t, 0)) return -1;
        int save_now = c->out_dir[0] && c->save_every > 0 && t->step % c->save_every == 0;
        if (save_now && save_checkpoint(t)) return -1;
    }
    return 0;
}

/* Whether every rank holds the same weights at the end (collective; a
 * parameter server's ranks compare shard by shard). */
static int check_replicas(trainer *t, const float *params)
{
    uint64_t hash = 0;
    int same;
    if (t->strat == STRAT_DDP)
        same = dt_ddp_replicas_identical(&t->ddp, &hash);
    else if (t->strat == STRAT_PS_WORKER || t->strat == STRAT_PS_SERVER)
        same = dt_ps_params_identical(&t->ps, t->comm, params, &hash);
    else
        return 0;
    if (same < 0) return comm_failed(t, "comparing replicas");
    if (!same) {
        dt_strf(t->err, sizeof t->err, "the ranks' weights differ at the end (a bug)");
        return -1;
    }
    fprintf(t->out, "replicas: %d ranks hold bit-identical weights (hash %016llx)\n", t->world,
            (unsigned long long)hash);
    return 0;
}

/* Asynchronous workers end at different moments and with different
 * parameters: they wait for each other, then all take the servers' last. */
static int settle_workers(trainer *t)
{
    if (dt_barrier(t->ps.role)) return failed_on(t, t->ps.role, "waiting for the other workers");
    if (dt_ps_worker_pull(&t->psw))
        return failed_on(t, t->psw.link, "pulling the final parameters");
    return 0;
}

static int finish(trainer *t)
{
    const dt_train_config *c = t->cfg;
    if (stop_signal) fprintf(t->out, "interrupted at step %ld\n", t->step);
    if (t->strat == STRAT_PS_WORKER && settle_workers(t)) return -1;
    /* Save first: a failing evaluation must not cost the trained weights. A
     * process that ran no step has nothing new to save. */
    int saved = c->save_every > 0 && t->step % c->save_every == 0;
    if (c->out_dir[0] && t->steps_run > 0 && !saved && save_checkpoint(t)) return -1;
    if (c->save_final[0] && (t->steps_run > 0 || !stop_signal)) {
        if (dt_weights_save(&t->model, c->save_final, t->err, sizeof t->err)) return -1;
        fprintf(t->out, "weights %s\n", c->save_final);
    }
    if (!stop_signal && report_eval(t, 1)) return -1;
    if (t->strat == STRAT_PS_WORKER && dt_ps_worker_stop(&t->psw))
        return failed_on(t, t->psw.link, "stopping the servers");
    if (check_replicas(t, t->model.params)) return -1;
    return print_rank_memory(t, t->comm ? "peak memory per rank" : "peak memory");
}

static double lr_at(const void *cfg, long step) { return dt_config_lr_at(cfg, step); }

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

/* Joins the parameter server's split of the job. A server keeps only its
 * shard's optimizer state; rank 0 hands the servers the starting state,
 * and every worker starts from the servers' parameters. */
static int setup_ps(trainer *t, int resuming)
{
    const dt_train_config *c = t->cfg;
    dt_compress_spec spec;
    if (dt_compress_parse(c->compress, &spec, t->err, sizeof t->err) ||
        dt_ps_join(&t->ps, t->comm, c->servers, &t->model, &spec, !strcmp(c->ps_mode, "async"),
                   c->staleness, t->err, sizeof t->err))
        return -1;
    if (t->strat == STRAT_PS_SERVER) {
        if (init_optimizer(t, dt_ps_shard_len(&t->ps, t->ps.index))) return -1;
        t->opt.base = t->ps.shard_lo[t->ps.index];
        return 0;
    }
    if (t->rank == 0 && spec.kind == DT_COMPRESS_TOPK && strcmp(c->optimizer, "sgd"))
        DT_WARN("--compress %s with %s: error feedback delivers each coordinate as a rare "
                "spike, which Adam normalises into a full-size step whatever its signal; "
                "top-k suits sgd (see docs/train.md)", c->compress, c->optimizer);
    if (dt_ps_worker_init(&t->psw, &t->ps, &t->model, t->err, sizeof t->err)) return -1;
    if (!t->ps.async) t->dp_comm = t->ps.role;
    t->psw.step = t->step;
    if (t->rank == 0 && dt_ps_worker_init_servers(&t->psw, resuming ? &t->opt : NULL, t->step))
        return failed_on(t, t->psw.link, "handing the servers their shards");
    if (dt_ps_worker_pull(&t->psw)) return failed_on(t, t->psw.link, "the first pull");
    if (!worker_needs_optimizer(t, 0)) dt_optimizer_free(&t->opt);
    return 0;
}

static int setup_parallel(trainer *t, int resuming)
{
    switch (t->strat) {
    case STRAT_DDP: t->dp_comm = t->comm; return setup_ddp(t);
    case STRAT_DP:
        return dt_naive_dp_init(&t->ndp, &t->model, t->dp_size, t->B, t->T, t->accum, t->err,
                                sizeof t->err);
    case STRAT_PS_WORKER:
    case STRAT_PS_SERVER: return setup_ps(t, resuming);
    default: return 0;
    }
}

/* A server needs the model's layout only: its shard comes from rank 0. */
static int setup_server_model(trainer *t, const char *resume_dir)
{
    dt_gpt_config mc;
    if (resolve_model_config(t, resume_dir, &mc)) return -1;
    dt_precision prec = strcmp(t->cfg->dtype, "bf16") == 0 ? DT_PREC_BF16 : DT_PREC_F32;
    return dt_gpt_create_layout(&t->model, &mc, prec, t->err, sizeof t->err);
}

/* Compute threads per device when not given: the cores shared among the
 * ranks on this host and the devices of each. */
static int default_threads(const trainer *t)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long share = (long)(t->comm ? dt_comm_local_size(t->comm) : 1) *
                 (t->strat == STRAT_DP ? t->dp_size : 1);
    long n = cores / (share > 0 ? share : 1);
    return n >= 1 ? (int)n : 1;
}

static int setup(trainer *t)
{
    dt_train_config *c = t->cfg;
    t->B = c->batch_size;
    t->T = c->seq_len;
    t->accum = c->grad_accum;
    t->global_batch = c->train_batch_size;
    t->threads = c->threads > 0 ? c->threads : default_threads(t);
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
    if (t->strat == STRAT_PS_SERVER)
        return setup_server_model(t, resuming ? resume_dir : NULL) || setup_parallel(t, resuming);
    int with_optimizer = t->strat != STRAT_PS_WORKER || worker_needs_optimizer(t, resuming);
    if (setup_model(t, resuming ? resume_dir : NULL, with_optimizer)) return -1;
    if (dt_dataset_check(t->train, t->T, t->err, sizeof t->err)) return -1;
    /* Validation data too short for one sequence would fail only at the end. */
    if (t->val && c->eval_batches > 0 && dt_dataset_check(t->val, t->T, t->err, sizeof t->err))
        return -1;
    if (resuming && resume(t, resume_dir)) return -1;
    if (setup_parallel(t, resuming)) return -1;
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
    dt_naive_dp_free(&t->ndp);
    if (t->comm) {
        dt_ps_worker_free(&t->psw);
        dt_ps_leave(&t->ps);
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

static int force_algo(void *comm, const char *coll, const char *algo, char *err, size_t n)
{
    if (dt_comm_set_algo(comm, coll, algo) == 0) return 0;
    return dt_strf(err, n, "--comm-algo: %s", dt_comm_error(comm)), -1;
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
    /* Communicators split from this one inherit its algorithms. */
    if (dt_config_each_comm_algo(t->cfg->comm_algo, force_algo, t->comm, err, errlen)) return -1;
    return 0;
}

/* Which part of the work this process does. */
static int choose_strategy(trainer *t, char *err, size_t errlen)
{
    const dt_train_config *c = t->cfg;
    if (dt_config_data_parallel_size(c, t->world, &t->dp_size, err, errlen)) return -1;
    t->dp_index = t->rank;
    if (!strcmp(c->strategy, "dp"))
        t->strat = t->dp_size > 1 ? STRAT_DP : STRAT_SINGLE;
    else if (!strcmp(c->strategy, "ps"))
        t->strat = t->rank >= t->dp_size ? STRAT_PS_SERVER : STRAT_PS_WORKER;
    else
        t->strat = t->world > 1 ? STRAT_DDP : STRAT_SINGLE;
    return 0;
}

/* A parameter server's rank: serves until the workers stop, then takes
 * part in the final comparison and the memory table. */
static int run_server(trainer *t)
{
    const dt_train_config *c = t->cfg;
    dt_ps_server_args a = {.ps = &t->ps, .layout = &t->model, .opt = &t->opt,
                           .lr_at = lr_at, .lr_ctx = c, .grad_clip = c->grad_clip};
    float *shard = NULL;
    long updates = 0;
    int rc = dt_ps_server_run(&a, &shard, &updates, t->err, sizeof t->err);
    if (rc == 0) rc = check_replicas(t, shard);
    dt_free(shard);
    if (rc == 0) rc = print_rank_memory(t, "peak memory per rank");
    return rc;
}

int dt_train(dt_train_config *cfg, char *err, size_t errlen)
{
    trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    if (join_job(&t, err, errlen) || choose_strategy(&t, err, errlen) ||
        dt_config_validate(cfg, t.dp_size, err, errlen)) {
        if (t.comm) dt_comm_destroy(t.comm);
        return -1;
    }
    /* Rank 0 speaks for the job unless every rank is asked to. With the
     * JSON log on stdout, the human-readable lines go to stderr. */
    t.out = strcmp(cfg->log_json, "-") == 0 ? stderr : stdout;
    if (t.rank != 0 && strcmp(cfg->log_ranks, "all") != 0) {
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
    if (rc == 0 && t.strat == STRAT_PS_SERVER) {
        rc = run_server(&t);
    } else if (rc == 0) {
        print_header(&t);
        rc = run_loop(&t);
        if (rc == 0) rc = finish(&t);
    }
    if (rc) dt_strf(err, errlen, "%s", t.err);
    /* The other ranks may wait in a collective for this one: stop them. */
    if (rc && t.comm) dt_comm_abort(t.comm, t.err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    teardown(&t);
    if (rc == 0 && stop_signal) {
        dt_strf(err, errlen, "interrupted by signal %d", (int)stop_signal);
        return 128 + stop_signal;
    }
    return rc;
}
