/* The training loop of one rank, whatever the strategy: data, model,
 * optimizer, evaluation, logging and checkpoints around the strategy
 * interface (parallel/strategy.h), which decides what this rank holds and
 * how its gradients and updates meet the other ranks'. See trainer.h.
 *
 * Step s trains on the global batch of G sequences whose counters are
 * s*G .. s*G+G-1 (data/sampler.h maps counters to sequences); the strategy
 * gives each rank its block. The logged loss of step s is the mean over
 * the global batch, before the update. */
#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/bootstrap/bootstrap.h"
#include "core/env.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/str.h"
#include "core/timer.h"
#include "core/trace.h"
#include "dtrain/comm.h"
#include "kernels/matmul.h"
#include "kernels/matmul_paths.h"
#include "kernels/profile.h"
#include "kernels/threads.h"
#include "parallel/registry.h"
#include "train/ckpt/checkpoint.h"
#include "train/ckpt/lock.h"
#include "train/config/agree.h"
#include "train/metrics.h"
#include "train/moe_stats.h"
#include "train/peak.h"
#include "train/product_paths.h"
#include "train/profile.h"
#include "train/run.h"
#include "train/step_waits.h"
#include "train/stop_signals.h"
#include "train/trace_file.h"
#include "train/trace_marks.h"
#include "train/trace_spool.h"
#include "train/weights/weights.h"


/* ---- one optimizer step --------------------------------------------------- */

/* Whether the parameters this rank holds are finite after the update: the
 * model's (whole, or the ranges the layers left it), or where the model
 * keeps none between uses (ZeRO-3), the rank's pieces; pieces in the
 * optimizer's store are not read back for it. A window's dropped pages are
 * not read: they would only fault in zeros. */
static int updated_finite_body(const dt_run *t, char *why, size_t n, double *floats)
{
    const dt_strategy *S = &t->S;
    const dt_gpt *m = &t->model;
    const dt_flat_ranges *r = S->shard_params || S->params_in_store ? S->shard : S->held;
    if (!r) {
        *floats += (double)m->n_floats;
        return dt_weights_check_finite(m, m->params, "", why, n);
    }
    for (int i = 0; i < r->n; i++) {
        const float *x = dt_strategy_params_at(S, &r->r[i]);
        if (!x) continue;
        *floats += (double)(r->r[i].hi - r->r[i].lo);
        if (dt_weights_check_finite_range(m, x, r->r[i].lo, r->r[i].hi, "", why, n)) return -1;
    }
    return 0;
}

/* --profile counts the check with the optimizer: a read of what the
 * update wrote. */
static int updated_finite(const dt_run *t, char *why, size_t n)
{
    const uint64_t t0 = dt_prof_begin();
    double floats = 0.0;
    int rc = updated_finite_body(t, why, n, &floats);
    dt_prof_end(DT_PROF_OPTIMIZER, t0, 0.0, 4.0 * floats);
    return rc;
}

/* The gradient norm is checked before the update (dt_strategy_step); the
 * weights after it, wherever it ran (a server's too: they come back), so
 * an update that overflowed never reaches a checkpoint. */
static int train_step(dt_run *t, double *loss, double *norm)
{
    double lr = dt_config_lr_at(t->cfg, t->step);
    if (dt_strategy_step(&t->S, t->step, t->seq_counter, lr, loss, norm)) return -1;
    char why[256];
    if (updated_finite(t, why, sizeof why))
        return dt_strf(ERR(t),
                       "step %ld: the update made the weights non-finite: %s; stopping (the last "
                       "checkpoint is untouched)",
                       t->step + 1, why), -1;
    t->seq_counter += (uint64_t)t->global_batch;
    return 0;
}

/* ---- the loop ------------------------------------------------------------- */

/* An evaluation between steps: its kernels are no step's parts, and
 * --profile would add them to the next step's (whose rest could then go
 * below 0). */
static int eval_unprofiled(dt_run *t)
{
    if (t->prof.on) dt_prof_enable(0);
    int rc = dt_run_eval(t, 0);
    if (t->prof.on) dt_prof_enable(1);
    return rc;
}

/* Whether to stop before the next step: 1 stop, 0 go on, -1 the ranks
 * could not agree (a peer died: ERR(t) says which). Ranks in lockstep
 * agree on it (a signal may reach one of them only), and every later
 * decision uses the agreed value, so their collectives keep matching;
 * asynchronous ranks stop on their own. A failure here ends the run at
 * once: going on to the final save and evaluation would only report it
 * later, from their first collective, as if they had failed. */
static int stop_requested(dt_run *t)
{
    int32_t sig = dt_stop_signals_pending();
    if (t->S.lockstep && dt_allreduce(t->S.lockstep, &sig, &sig, 1, DT_I32, DT_MAX) != 0)
        return dt_strf(ERR(t), "before step %ld, agreeing whether to stop: %s", t->step + 1,
                       dt_comm_error(t->S.lockstep)), -1;
    t->stop = sig;
    return sig != 0;
}

/* A step that timed product paths ran slower by that time: say so under
 * its line, once for the step. */
static void report_paths_timed(dt_run *t)
{
    int classes;
    double seconds;
    dt_mm_paths_timed(&classes, &seconds);
    if (classes == t->paths_timed) return;
    fprintf(t->out,
            "  (this rank timed %d matrix-product shapes on each path on this CPU, %.1f s in all "
            "so far; the fastest path of each is kept for every run on this host in %s)\n",
            classes, seconds, t->paths_file);
    t->paths_timed = classes;
}

/* The step's communication: this rank's bytes and wait, and the job's view
 * of the waits (collective over the lockstep group). */
static int step_comm(dt_run *t, dt_step_stats *s)
{
    uint64_t bytes;
    dt_strategy_traffic(&t->S, &s->comm_ms, &bytes);
    s->bytes_sent = bytes;
    s->rank = t->r.rank;
    if (dt_step_waits_agree(t, t->step, s->comm_ms, &s->waits)) return -1;
    if (t->steps_run > 0) /* the first step builds the kernels */
        dt_step_waits_count(&t->waits, &s->waits, s->comm_ms, s->ms, t->r.size);
    return 0;
}

static int run_loop(dt_run *t)
{
    const dt_train_config *c = t->cfg;
    const double flops_tok = dt_gpt_flops_per_token(&t->model.cfg, t->r.T);
    double ms_avg = 0; /* over steps after the first, which pays for kernel generation */
    long averaged = -1;
    int stop = 0;
    const uint64_t loop0 = dt_now_ns();
    if (c->profile) dt_run_profile_start(t);
    while (t->step < c->steps && !(stop = stop_requested(t))) {
        dt_fault_set_step(t->step + 1); /* as the log numbers it */
        uint64_t t0 = dt_now_ns(), read0 = 0, wait0 = 0, read1, wait1;
        if (t->opt.store) dt_opt_store_totals(t->opt.store, &read0, &wait0);
        double loss = 0, norm = 0;
        dt_moe_step moe;
        dt_moe_step_begin(t);
        if (train_step(t, &loss, &norm)) return -1;
        const int print = c->print_every > 0 &&
                          ((t->step + 1) % c->print_every == 0 || t->step + 1 == c->steps);
        if (dt_moe_step_end(t, &moe, t->out, print && c->moe_log_load)) return -1;
        uint64_t t1 = dt_now_ns();
        dt_trace_args ta = dt_trace_noargs();
        ta.step = (int)t->step;
        dt_trace_add(DT_TRACE_STEP, "step", t0, t1, &ta);
        double ms = (double)(t1 - t0) * 1e-6;
        if (++averaged > 0) ms_avg += (ms - ms_avg) / (double)averaged;
        double tps = (double)t->global_batch * t->r.T / (ms * 1e-3);
        dt_step_stats s = {.step = t->step, .steps = c->steps, .loss = loss, .grad_norm = norm,
                           .lr = dt_config_lr_at(c, t->step), .ms = ms, .tokens_per_s = tps,
                           .mfu = dt_mfu(tps * flops_tok, t->peak),
                           .eta_s = (double)(c->steps - t->step - 1) *
                                    (averaged > 0 ? ms_avg : ms) * 1e-3,
                           .ranks = t->r.size > t->S.dp_size ? t->r.size : t->S.dp_size,
                           .moe = moe.on, .aux_loss = moe.aux_loss, .z_loss = moe.z_loss,
                           .dropped = moe.dropped,
                           .ep_skew = moe.ep_skew};
        if (step_comm(t, &s)) return -1;
        if (t->prof.on) dt_run_profile_step(t, ms, s.comm_ms);
        s.nprof = dt_run_profile_last(t, &s.prof_names, &s.prof_ms);
        if (t->opt.store) {
            uint64_t bytes;
            s.offload = 1;
            dt_opt_store_last_step(t->opt.store, &bytes, &s.io_wall_ms);
            dt_opt_store_totals(t->opt.store, &read1, &wait1);
            s.io_bytes = bytes;
            s.io_param_bytes = read1 - read0;
            s.io_ms = (double)(wait1 - wait0) * 1e-6; /* the stream's waits and the reads' */
        }
        t->last_loss = loss;
        t->step++;
        t->steps_run++;
        if (print) dt_print_step(t->out, &s);
        if (print) report_paths_timed(t);
        if (t->json && dt_run_log_failed(t, dt_log_json_step(t->json, &s))) return -1;
        if (!isfinite(loss))
            return dt_strf(ERR(t), "step %ld: the loss is %f: training diverged", t->step, loss),
                   -1;
        int eval_now = c->eval_every > 0 && t->step % c->eval_every == 0 && t->step < c->steps;
        if (eval_now && eval_unprofiled(t)) return -1;
        int save_now = c->out_dir[0] && c->save_every > 0 && t->step % c->save_every == 0;
        const int from_snapshot = save_now && dt_run_snapshots_save_async(t);
        if (save_now && !from_snapshot && dt_run_save(t)) return -1;
        if (dt_run_snapshot_after_step(t, from_snapshot)) return -1;
        char why[512];
        if (dt_trace_spool_step(why, sizeof why)) DT_WARN("%s", why);
    }
    if (dt_run_snapshot_writer_end(t, 0)) return -1; /* the last snapshot published */
    dt_run_snapshots_summary(t, (double)(dt_now_ns() - loop0) * 1e-9);
    dt_step_waits_report(t->out, &t->waits, t->r.rank);
    dt_run_profile_report(t);
    return stop < 0 ? -1 : 0;
}

/* --trace: every rank's events to rank 0, which writes the file
 * (collective: training and serving ranks alike call it). */
static int write_trace(dt_run *t)
{
    if (!t->cfg->trace[0]) return 0;
    if (dt_trace_write(t->r.world, t->cfg->trace, ERR(t))) return -1;
    if (t->r.rank == 0) fprintf(t->out, "trace %s\n", t->cfg->trace);
    return 0;
}

static int finish(dt_run *t)
{
    const dt_train_config *c = t->cfg;
    if (t->stop) fprintf(t->out, "interrupted at step %ld\n", t->step);
    if (dt_strategy_end(&t->S)) return -1;
    /* Save first: a failing evaluation must not cost the trained weights. A
     * process that ran no step has nothing new to save. */
    int saved = c->save_every > 0 && t->step % c->save_every == 0;
    if (c->out_dir[0] && t->steps_run > 0 && !saved && dt_run_save(t)) return -1;
    if (c->save_final[0] && (t->steps_run > 0 || !t->stop)) {
        /* Every rank: a strategy that shards the parameters gathers them. */
        if (dt_strategy_gather_params(&t->S)) return -1;
        const dt_gpt *whole = t->S.whole ? t->S.whole : &t->model;
        dt_st_dtype dtype = DT_ST_F32;
        (void)dt_weights_dtype_parse(c->save_dtype, &dtype); /* a choice of the table's */
        if (t->S.writes_checkpoints && dt_weights_save_as(whole, c->save_final, dtype, ERR(t)))
            return -1;
        if (t->S.writes_checkpoints) fprintf(t->out, "weights %s\n", c->save_final);
    }
    if (!t->stop && dt_run_eval(t, 1)) return -1;
    if (dt_strategy_release(&t->S)) return -1;
    if (dt_run_check_replicas(t) || write_trace(t)) return -1;
    return dt_run_print_memory(t, t->r.world ? "peak memory per rank" : "peak memory");
}

/* A rank that serves the others instead of training: it takes part in the
 * final comparison and the memory table when they are done. */
static int serve(dt_run *t)
{
    if (dt_strategy_serve(&t->S) || dt_run_check_replicas(t) || write_trace(t)) return -1;
    return dt_run_print_memory(t, "peak memory per rank");
}

/* Compute threads per model when not given: the cores shared among the
 * ranks on this host and the models each computes at once. */
static int default_threads(const dt_run *t)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long share = (long)(t->r.world ? dt_comm_local_size(t->r.world) : 1) * t->S.compute_streams;
    long n = cores / (share > 0 ? share : 1);
    return n >= 1 ? (int)n : 1;
}

/* The layers of this rank's strategy, from --strategy. */
static int build_strategy(dt_run *t)
{
    const dt_strategy_kind *kind = dt_strategy_find(t->cfg->strategy);
    dt_strategy_init(&t->S, &t->r);
    if (!kind) return dt_strf(ERR(t), "--strategy %s: no such strategy", t->cfg->strategy), -1;
    dt_parallel_opts o = dt_config_parallel_opts(t->cfg);
    return kind->build(&t->S, &o);
}

/* How bf16 products run sets their bits (kernels/matmul.h), so rank 0's
 * loop rates, cached per CPU (train/peak.h), decide for every rank: two
 * ranks timing their own could land on either side of the line on a busy
 * machine, and two runs of a layout would then differ. */
static int agree_bf16_path(dt_run *t)
{
    if (strcmp(t->cfg->dtype, "bf16") != 0) return 0;
    double rates[2] = {0, 0};
    if (t->r.rank == 0) dt_peak_bf16_rates(t->threads, rates);
    if (t->r.world && dt_broadcast(t->r.world, rates, rates, 2, DT_F64, 0))
        return comm_failed(t, t->r.world, "agreeing on how bf16 products run");
    dt_matmul_bf16_choose(rates[0], rates[1]);
    return 0;
}

/* fp32 products take the paths this host measured (train/product_paths.h):
 * every rank on the host reads and extends the same file. */
static int start_product_paths(dt_run *t)
{
    if (dt_product_paths_start(t->paths_file, sizeof t->paths_file, ERR(t))) return -1;
    if (t->r.rank == 0) DT_DEBUG("matrix-product paths: %s", t->paths_file);
    return 0;
}


/* Recording from here on; the clocks aligned with rank 0's (collective). */
static int start_trace(dt_run *t)
{
    if (dt_trace_start()) return dt_strf(ERR(t), "--trace: out of memory for the events"), -1;
    if (dt_trace_sync_clock(t->r.world))
        return comm_failed(t, t->r.world, "--trace: aligning the ranks' clocks");
    return 0;
}

/* --trace under a launcher that restarts: a rank killed writes no trace,
 * so each rank keeps its events in the job's directory step by step, and
 * rank 0 marks the attempt and the failure before it, for the attempt that
 * writes the file (trace_spool.h, trace_marks.h). Without them the file
 * still holds this attempt: a warning, not an error. */
static void trace_across_restarts(dt_run *t)
{
    char why[512];
    if (!t->cfg->trace[0] || t->snap.max_restarts == 0) return;
    if (dt_trace_spool_open(t->snap.dir, t->r.rank, t->snap.restart, dt_trace_clock_offset_ns(),
                            why, sizeof why))
        DT_WARN("%s", why);
    if (t->r.rank == 0 &&
        dt_trace_marks_open(t->snap.dir, t->snap.restart, dt_trace_started_ns(),
                            t->snap.failure_ns, dt_env_str("DTRAIN_FAILED_RANK"),
                            dt_env_str("DTRAIN_FAILURE"), why, sizeof why))
        DT_WARN("%s", why);
    if (t->r.rank == 0) dt_trace_marks_backfill(dt_env_str("DTRAIN_FAILURES"));
}

static int setup(dt_run *t)
{
    dt_train_config *c = t->cfg;
    t->r.B = c->batch_size;
    t->r.T = c->seq_len;
    t->r.accum = c->grad_accum;
    t->r.batch = dt_run_fetch_batch;
    t->r.batch_ctx = t;
    t->r.lr_at = dt_run_lr_at;
    t->r.lr_ctx = c;
    t->r.grad_clip = c->grad_clip;
    t->r.saves = c->out_dir[0] != '\0' || dt_run_snapshots_wanted();
    t->r.resuming = c->resume_flag;
    t->r.model = &t->model;
    t->r.opt = &t->opt;
    t->global_batch = c->train_batch_size;
    if (build_strategy(t)) return -1;
    t->threads = c->threads > 0 ? c->threads : default_threads(t);
    dt_kernels_set_threads(t->threads);
    if (agree_bf16_path(t) || start_product_paths(t)) return -1;
    dt_sampler_init(&t->train_order, c->seed, c->shuffle);
    dt_sampler_init(&t->val_order, c->seed, 0);
    if (dt_run_check_outputs(t) || dt_run_open_data(t)) return -1;
    if (c->trace[0] && start_trace(t)) return -1;
    /* One run per --out: two would prune each other's checkpoints. */
    if (c->out_dir[0] && t->S.writes_checkpoints &&
        (t->lock_fd = dt_ckpt_lock(c->out_dir, ERR(t))) < 0)
        return -1;
    char resume_dir[DT_CONFIG_PATH + 64];
    const char *where;
    if (dt_run_snapshots_setup(t, &where)) return -1;
    if (where && dt_ckpt_resolve(where, resume_dir, sizeof resume_dir, ERR(t))) return -1;
    if (!t->r.resuming && c->out_dir[0] && t->r.rank == 0 && dt_ckpt_exists(c->out_dir))
        return dt_strf(ERR(t),
                       "--out %s already holds checkpoints: add --resume to continue that run, "
                       "or choose another directory",
                       c->out_dir), -1;
    const uint64_t load0 = dt_now_ns();
    if (dt_run_setup_model(t, where ? resume_dir : NULL)) return -1;
    t->snap.loaded_ns = dt_now_ns();
    if (!t->snap.pooled_ns) t->snap.pool_ns = t->snap.pooled_ns = load0;
    if (dt_run_snapshots_start(t, where)) return -1;
    trace_across_restarts(t);
    dt_run_print_shrink(t);
    /* MFU's peak: every computing rank's threads (a process computes
     * compute_streams models at once, each on t->threads threads; a job
     * that shrank computes its blocks on the ranks it has). */
    const int computing = t->r.vsize ? t->r.size : t->S.dp_size * t->S.block_ranks;
    if (!dt_strategy_serves(&t->S) &&
        dt_mfu_peak(t->threads * t->S.compute_streams, computing / t->S.compute_streams,
                    t->model.prec == DT_PREC_BF16, &t->peak, t->peak_desc, sizeof t->peak_desc))
        return dt_strf(ERR(t), "%s", t->peak_desc), -1;
    t->rank_peak = t->peak / (double)(computing / t->S.compute_streams > 0
                                          ? computing / t->S.compute_streams : 1);
    /* The header reports the model actually built (sizes may come from a file). */
    c->n_layer = t->model.cfg.n_layer;
    c->n_head = t->model.cfg.n_head;
    c->n_embd = t->model.cfg.n_embd;
    c->vocab_size = t->model.cfg.vocab_size;
    c->block_size = t->model.cfg.block_size;
    c->seq_len = t->r.T;
    return t->r.rank == 0 && !dt_strategy_serves(&t->S) ? dt_run_open_log(t, t->r.resuming) : 0;
}

static void teardown(dt_run *t)
{
    dt_run_snapshot_writer_end(t, 1); /* first: it reads the model's layout */
    if (t->json && t->json != stdout) fclose(t->json);
    if (t->out && t->out != stdout && t->out != stderr) fclose(t->out);
    dt_strategy_destroy(&t->S);
    dt_trace_spool_close();
    dt_trace_marks_close();
    dt_trace_stop();
    dt_ckpt_unlock(t->lock_fd);
    if (t->r.world) dt_comm_destroy(t->r.world);
    free(t->r.inputs);
    free(t->r.targets);
    dt_step_waits_free(&t->waits);
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
static int join_job(dt_run *t, char *err, size_t errlen)
{
    dt_bootstrap b;
    t->r.size = 1;
    if (dt_run_virtual_env(t, err, errlen) || dt_bootstrap_from_env(&b, err, errlen) != 0)
        return -1;
    /* One rank left of a job that shrank still reduces as the job did. */
    if (b.size <= 1 && t->r.vsize <= 1) return 0;
    if (dt_comm_init(&t->r.world) != 0)
        return dt_strf(err, errlen, "joining the job: %s", dt_last_error()), -1;
    t->r.rank = dt_comm_rank(t->r.world);
    t->r.size = dt_comm_size(t->r.world);
    dt_log_set_rank(t->r.rank);
    if (dt_run_virtual_joined(t, err, errlen)) return -1;
    /* Every rank started with the same options, checked before anything
     * whose collectives depend on them (the algorithms forced below, the
     * strategy's groups) and before a rank refuses its own: a rank given
     * --pp 3 of two says, as the other does, that --pp differs. */
    if (dt_config_agree(t->r.world, t->cfg, err, errlen)) return -1;
    /* Communicators split from this one inherit its algorithms. */
    return dt_config_each_comm_algo(t->cfg->comm_algo, force_algo, t->r.world, err, errlen);
}

/* Rank 0 speaks for the job unless every rank is asked to. With the JSON
 * log on stdout, the human-readable lines go to stderr. */
static void choose_output(dt_run *t)
{
    t->out = strcmp(t->cfg->log_json, "-") == 0 ? stderr : stdout;
    if (t->r.rank != 0 && strcmp(t->cfg->log_ranks, "all") != 0) {
        FILE *quiet = fopen("/dev/null", "w");
        if (quiet) t->out = quiet;
    }
}

int dt_train(dt_train_config *cfg, char *err, size_t errlen)
{
    dt_run t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg;
    t.lock_fd = -1;
    t.snap.entry_ns = dt_now_ns();
    /* Before any thread starts: the communicator's progress thread adds
     * gradients as the kernels do, denormals flushed (kernels/threads.h). */
    dt_kernels_flush_denormals();
    const int joined = join_job(&t, err, errlen);
    t.snap.joined_ns = dt_now_ns();
    if (joined ||
        dt_config_data_parallel_size(cfg, t.r.vsize ? t.r.vsize : t.r.size, &t.dp_size, err,
                                     errlen) ||
        dt_config_validate(cfg, t.dp_size, err, errlen)) {
        /* The options agree (dt_config_agree), so every rank refuses them
         * alike and none waits for another: a goodbye, not an abort, which
         * could overtake the last block of the check's all-gather. */
        if (t.r.world) dt_comm_destroy(t.r.world);
        return -1;
    }
    choose_output(&t);
    dt_stop_signals_start(); /* Ctrl-C: stop after the step, save (stop_signals.h) */
    int rc = setup(&t);
    if (rc == 0 && dt_strategy_serves(&t.S)) {
        rc = serve(&t);
    } else if (rc == 0) {
        rc = dt_run_print_header(&t);
        if (rc == 0) rc = run_loop(&t);
        if (rc == 0) rc = finish(&t);
    }
    if (rc) dt_strf(err, errlen, "%s", t.r.err);
    /* The other ranks may wait in a collective for this one: stop them. */
    if (rc && t.r.world) dt_comm_abort(t.r.world, t.r.err);
    dt_stop_signals_end();
    teardown(&t);
    if (rc == 0 && t.stop) {
        dt_strf(err, errlen, "interrupted by signal %d", t.stop);
        return 128 + t.stop;
    }
    return rc;
}
