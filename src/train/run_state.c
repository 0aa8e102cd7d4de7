/* What a rank holds and its state: data, the model and optimizer the
 * strategy gives it, the starting weights (initialisation, --init, or a
 * checkpoint), and checkpoints of the run. See run.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/file.h"
#include "core/log.h"
#include "core/str.h"
#include "core/timer.h"
#include "train/ckpt/checkpoint.h"
#include "train/ckpt/shard.h"
#include "train/data/corpus.h"
#include "train/profile.h"
#include "train/run.h"
#include "train/weights/model_source.h"
#include "train/weights/weights.h"

int dt_run_open_data(dt_run *t)
{
    const dt_train_config *c = t->cfg;
    char train_file[DT_CONFIG_PATH], val_file[DT_CONFIG_PATH];
    if (dt_data_files(c->data, c->val_data, train_file, val_file, sizeof train_file, ERR(t)))
        return -1;
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

int dt_run_fetch_batch(void *ctx, uint64_t first, int n, int32_t *inputs, int32_t *targets,
                       char *err, size_t errlen)
{
    dt_run *t = ctx;
    const uint64_t t0 = t->prof.on ? dt_now_ns() : 0;
    const int rc = dt_dataset_batch(t->train, &t->train_order, first, n, t->r.T, inputs, targets,
                                    err, errlen);
    if (t0) dt_run_profile_data(t, dt_now_ns() - t0);
    return rc;
}

double dt_run_lr_at(const void *cfg, long step) { return dt_config_lr_at(cfg, step); }

/* Every file the run will write is checked before the first step: a typo
 * in --save-final must not cost the training it would have saved. */
int dt_run_check_outputs(dt_run *t)
{
    const dt_train_config *c = t->cfg;
    /* Rank 0 writes the timeline, whoever writes the checkpoints. */
    if (c->trace[0] && t->r.rank == 0 && dt_check_output_file("--trace", c->trace, ERR(t)))
        return -1;
    if (!t->S.writes_checkpoints) return 0;
    if (c->out_dir[0] && dt_check_dir_writable("--out", c->out_dir, ERR(t))) return -1;
    if (c->save_final[0] && dt_weights_check_output("--save-final", c->save_final, ERR(t)))
        return -1;
    return 0;
}

static int alloc_model(dt_run *t, const dt_share *share)
{
    dt_gpt *m = &t->model;
    if (dt_gpt_alloc_params(m) || dt_gpt_alloc_grads(m) ||
        (share->nslots > 0 ? dt_gpt_alloc_slots(m, t->r.B, t->r.T, share->nslots, share->slots)
                           : dt_gpt_alloc_acts(m, t->r.B, t->r.T)))
        return dt_strf(ERR(t), "%s", m->error), -1;
    t->r.inputs = malloc((size_t)t->r.B * t->r.T * sizeof(int32_t));
    t->r.targets = malloc((size_t)t->r.B * t->r.T * sizeof(int32_t));
    if (!t->r.inputs || !t->r.targets) return dt_strf(ERR(t), "out of memory for the batch"), -1;
    return 0;
}

/* Optimizer state for floats [lo, hi) of the flat layout: in memory, or
 * in a file under --nvme-path named for this process and rank. */
static int init_optimizer(dt_run *t, size_t lo, size_t hi)
{
    const dt_train_config *c = t->cfg;
    dt_opt_kind kind;
    if (dt_opt_kind_parse(c->optimizer, &kind))
        return dt_strf(ERR(t), "optimizer %s: unknown", c->optimizer), -1;
    if (strcmp(c->offload_optimizer, "nvme") == 0) {
        dt_offload_opts o = dt_config_offload_opts(c);
        char tag[64];
        snprintf(tag, sizeof tag, "%ld-rank%d", (long)getpid(), t->r.rank);
        if (dt_optimizer_init_offload(&t->opt, kind, hi - lo, c->beta1, c->beta2, c->eps,
                                      c->weight_decay, c->momentum, &o, t->S.params_in_store,
                                      tag, ERR(t)))
            return -1;
    } else if (dt_optimizer_init(&t->opt, kind, hi - lo, c->beta1, c->beta2, c->eps,
                                 c->weight_decay, c->momentum)) {
        return dt_strf(ERR(t), "optimizer %s: cannot set up its state", c->optimizer), -1;
    }
    t->opt.base = lo;
    return 0;
}

dt_gpt *dt_run_file_layout(dt_run *t) { return t->S.whole ? t->S.whole : &t->model; }

int dt_run_file_ranges(dt_run *t, const dt_flat_ranges *mine, dt_flat_ranges *out,
                       dt_flat_range **tmp)
{
    static const dt_flat_range all_lo = {0, 0, 0};
    const dt_flat_ranges *map = t->S.in_whole;
    *tmp = NULL;
    if (!mine && map) return *out = *map, 0;
    if (!mine) {
        if (!(*tmp = malloc(sizeof **tmp))) return dt_strf(ERR(t), "out of memory"), -1;
        **tmp = all_lo;
        (*tmp)->hi = t->model.n_floats;
        return *out = (dt_flat_ranges){1, *tmp, t->model.n_floats}, 0;
    }
    if (!map) return *out = *mine, 0;
    if (!(*tmp = malloc((size_t)(mine->n + map->n) * sizeof **tmp)))
        return dt_strf(ERR(t), "out of memory"), -1;
    *out = dt_flat_ranges_compose(mine, map, *tmp);
    return 0;
}

/* A checkpoint's values of this rank's ranges (NULL: all of its layout)
 * into params and o, by the ranges' `at`. */
static int load_ranges(dt_run *t, const char *dir, const dt_flat_ranges *mine, float *params,
                       dt_optimizer *o, dt_ckpt_state *st)
{
    dt_flat_ranges in_file;
    dt_flat_range *tmp;
    if (dt_run_file_ranges(t, mine, &in_file, &tmp)) return -1;
    int rc = dt_ckpt_load_ranges(dir, dt_run_file_layout(t), &in_file, params, o, st, ERR(t));
    free(tmp);
    return rc ? -1 : 0;
}

/* A model that holds some ranges (a pipeline stage's): their parameters in
 * place. */
static int load_held_params(dt_run *t, const char *dir, dt_ckpt_state *st)
{
    const dt_flat_ranges *held = t->S.held;
    dt_flat_range *flat = malloc((size_t)held->n * sizeof *flat);
    if (!flat) return dt_strf(ERR(t), "resume: out of memory"), -1;
    for (int i = 0; i < held->n; i++)
        flat[i] = (dt_flat_range){held->r[i].lo, held->r[i].hi, held->r[i].lo};
    dt_flat_ranges in_place = {held->n, flat, t->model.n_floats};
    int rc = load_ranges(t, dir, &in_place, t->model.params, NULL, st);
    free(flat);
    return rc;
}

/* The checkpoint's parameters, optimizer state and position into what this
 * rank holds, from a checkpoint of any layout (ckpt/shard.h): the
 * parameters whole, a stage's ranges in place, or a strategy's own pieces
 * (ZeRO-3, mixed precision's masters); the optimizer state over the ranges
 * this rank updates (dt_strategy_updates). */
static int load_state(dt_run *t, const char *dir, dt_ckpt_state *st)
{
    const dt_flat_ranges *mine = dt_strategy_updates(&t->S);
    if (!mine) return load_ranges(t, dir, NULL, t->model.params, &t->opt, st);
    float *pieces = dt_strategy_pieces(&t->S);
    if (pieces) {
        t->r.pieces_filled = 1;
        return load_ranges(t, dir, mine, pieces, &t->opt, st);
    }
    if (t->S.held ? load_held_params(t, dir, st)
                  : load_ranges(t, dir, NULL, t->model.params, NULL, st))
        return -1;
    return load_ranges(t, dir, mine, NULL, &t->opt, NULL);
}

/* The experts' bias of aux-loss-free balancing as the checkpoint left it
 * (the same on every rank): the routing the next step makes. A checkpoint
 * saved without the bias starts it at zero, as a run that turns it on. */
static int resume_moe_bias(dt_run *t, const char *dir)
{
    dt_gpt *m = &t->model;
    const size_t n = m->moe.bias ? (size_t)m->cfg.n_layer * m->cfg.moe.experts : 0;
    const int rc = dt_ckpt_read_moe_bias(dir, m->moe.bias, n, ERR(t));
    if (rc == 1 && n)
        DT_WARN("%s holds no experts' bias (saved without --moe-router-enable-expert-bias): "
                "it starts at zero", dir);
    return rc < 0 ? -1 : 0;
}

static int resume(dt_run *t, const char *dir)
{
    dt_ckpt_state st;
    if (dt_optimizer_state_map(&t->opt, ERR(t))) return -1;
    int rc = load_state(t, dir, &st);
    char why[256];
    if (dt_optimizer_state_unmap(&t->opt, rc == 0, why, sizeof why) && rc == 0)
        return dt_strf(ERR(t), "%s", why), -1;
    if (rc || resume_moe_bias(t, dir)) return -1;
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

/* --init FILE into what this rank keeps of the parameters: a rank with
 * its own fp32 pieces (ZeRO-3, or mixed precision's masters) those pieces,
 * directly; a pipeline stage its ranges, in place; else all of them. */
static int load_init(dt_run *t)
{
    const char *path = t->cfg->init;
    float *pieces = dt_strategy_pieces(&t->S);
    const dt_flat_ranges *keep = pieces ? t->S.shard : t->S.held;
    float *dst = pieces ? pieces : t->model.params;
    if (!keep && !t->S.in_whole) return dt_weights_load(&t->model, path, ERR(t));
    t->r.pieces_filled = pieces != NULL;
    /* Ranges of the rank's own layout, read by `at` (a stage's in place). */
    dt_flat_range *flat = NULL, *tmp;
    dt_flat_ranges own, in_file;
    if (keep && !pieces) {
        if (!(flat = malloc((size_t)keep->n * sizeof *flat)))
            return dt_strf(ERR(t), "--init: out of memory"), -1;
        for (int i = 0; i < keep->n; i++)
            flat[i] = (dt_flat_range){keep->r[i].lo, keep->r[i].hi, keep->r[i].lo};
        own = (dt_flat_ranges){keep->n, flat, t->model.n_floats};
        keep = &own;
    }
    int rc = dt_run_file_ranges(t, keep, &in_file, &tmp) ||
             dt_weights_load_ranges(dt_run_file_layout(t), path, &in_file, dst, 1, ERR(t));
    free(flat);
    free(tmp);
    return rc ? -1 : 0;
}

/* The starting weights of a rank that holds the model: a checkpoint, a
 * weights file, or the initialisation. */
static int starting_weights(dt_run *t, const char *resume_dir)
{
    const dt_train_config *c = t->cfg;
    if (dt_dataset_check(t->train, t->r.T, ERR(t))) return -1;
    /* Validation data too short for one sequence would fail only at the end. */
    if (t->val && c->eval_batches > 0 && dt_dataset_check(t->val, t->r.T, ERR(t))) return -1;
    if (resume_dir) return resume(t, resume_dir);
    if (c->init[0]) { /* pieces in the optimizer's store are filled through its mapping */
        if (dt_optimizer_state_map(&t->opt, ERR(t))) return -1;
        int rc = load_init(t);
        char why[256];
        if (dt_optimizer_state_unmap(&t->opt, rc == 0, why, sizeof why) && rc == 0)
            return dt_strf(ERR(t), "%s", why), -1;
        return rc;
    }
    dt_gpt_init_weights(&t->model, c->seed);
    return 0;
}

/* The model's layout, then what the strategy says this rank holds, then
 * its starting state; finally the ranks agree on it. */
int dt_run_setup_model(dt_run *t, const char *resume_dir)
{
    const dt_train_config *c = t->cfg;
    dt_gpt_config mc;
    if (dt_model_source_config(c, resume_dir, t->train, t->val, &t->r.T, &mc, ERR(t)))
        return -1;
    dt_precision prec = strcmp(c->dtype, "bf16") == 0 ? DT_PREC_BF16 : DT_PREC_F32;
    if (dt_gpt_create_layout(&t->model, &mc, prec, ERR(t))) return -1;
    /* bf16 is mixed precision: bf16 working parameters, fp32 master weights. */
    if (prec == DT_PREC_BF16 && dt_gpt_set_mixed(&t->model))
        return dt_strf(ERR(t), "%s", t->model.error), -1;
    if (!strcmp(c->grad_accum_dtype, "bf16") && dt_gpt_set_grads16(&t->model))
        return dt_strf(ERR(t), "%s", t->model.error), -1;
    /* Before plan: a strategy may read it (the pipeline's cost partition
     * times layers the way the run will run them). */
    if (dt_recompute_parse(c->recompute, &t->model.acts.recompute))
        return dt_strf(ERR(t), "unknown --recompute '%s'", c->recompute), -1;
    dt_share share;
    if (dt_strategy_plan(&t->S, &t->model, &share)) return -1;
    if (share.model && alloc_model(t, &share)) return -1;
    if (share.opt_ranges.n > 0 ? init_optimizer(t, 0, share.opt_ranges.len)
                               : share.opt_hi > share.opt_lo &&
                                     init_optimizer(t, share.opt_lo, share.opt_hi))
        return -1;
    if (share.model && starting_weights(t, resume_dir)) return -1;
    t->r.first_step = t->step;
    /* The batch arithmetic was validated for dp_size blocks: a strategy
     * that split otherwise would train on overlapping data. */
    if (!dt_strategy_serves(&t->S) && t->S.dp_size != t->dp_size)
        return dt_strf(ERR(t), "strategy %s splits each batch into %d blocks, the configuration "
                       "was checked for %d (a bug)", t->cfg->strategy, t->S.dp_size, t->dp_size),
               -1;
    if (dt_strategy_start(&t->S)) return -1;
    /* The bf16 working copy of whole master weights, as they now stand (a
     * strategy that holds pieces keeps its own). */
    const dt_flat_ranges *held = t->S.held;
    for (int i = 0; share.model && !t->S.shard && i < (held ? held->n : 1); i++)
        dt_gpt_sync_working(&t->model, held ? held->r[i].lo : 0,
                            held ? held->r[i].hi : t->model.n_floats);
    return 0;
}

/* A strategy that holds pieces (ZeRO, a pipeline's stages): every rank of
 * the save group writes its own shard; where the parameters are in the
 * model, this rank's pieces are copied out. */
static int save_sharded(dt_run *t, const char *dir, long keep, const dt_flat_ranges *mine,
                        const dt_ckpt_state *st, char *path, size_t n)
{
    /* A deferred update (--offload-overlap) finished first. */
    if (dt_optimizer_settle(&t->opt, SIZE_MAX, ERR(t))) return -1;
    float *params = dt_strategy_pieces(&t->S), *copy = NULL;
    if (!params) {
        if (!(copy = malloc(mine->len * sizeof(float))))
            return dt_strf(ERR(t), "checkpoint: out of memory for this rank's pieces"), -1;
        memset(copy, 0, mine->len * sizeof(float));
        for (int i = 0; i < mine->n; i++)
            memcpy(copy + mine->r[i].at, t->model.params + mine->r[i].lo,
                   (mine->r[i].hi - mine->r[i].lo) * sizeof(float));
        params = copy;
    }
    dt_flat_ranges in_file;
    dt_flat_range *tmp = NULL;
    int rc = dt_run_file_ranges(t, mine, &in_file, &tmp) ||
             dt_ckpt_save_sharded(dir, dt_run_file_layout(t), &in_file, params, &t->opt, st,
                                  t->cfg->zero_stage,
                                  t->S.save_group ? t->S.save_group : t->S.lockstep, keep, path,
                                  n, ERR(t));
    free(copy);
    free(tmp);
    return rc ? -1 : 0;
}

/* Collective: the strategy gathers what the writer needs, then it writes
 * (or every rank writes its shard) into the run directory dir, keeping
 * its keep newest; the checkpoint's path into path. */
int dt_run_save_to(dt_run *t, const char *dir, long keep, char *path, size_t len)
{
    path[0] = 0;
    if (dt_strategy_before_save(&t->S)) return -1;
    const dt_flat_ranges *mine = t->S.saves ? t->S.saves : t->S.shard;
    if (!t->S.writes_checkpoints && !mine) return 0;
    dt_ckpt_state st = dt_run_ckpt_state(t);
    char why[256];
    if (dt_optimizer_state_map(&t->opt, ERR(t))) return -1;
    int rc = mine ? save_sharded(t, dir, keep, mine, &st, path, len)
                  : dt_ckpt_save(dir, &t->model, &t->opt, &st, keep, path, len, ERR(t));
    if (dt_optimizer_state_unmap(&t->opt, 0, why, sizeof why) && rc == 0)
        return dt_strf(ERR(t), "%s", why), -1;
    return rc ? -1 : 0;
}

dt_ckpt_state dt_run_ckpt_state(dt_run *t)
{
    return (dt_ckpt_state){.step = t->step,
                           .seq_counter = t->seq_counter,
                           .seed = t->cfg->seed,
                           .shuffle = t->cfg->shuffle,
                           .seq_len = t->r.T,
                           .global_batch = t->global_batch,
                           .last_loss = t->last_loss,
                           .data_tokens = dt_dataset_ntokens(t->train),
                           .moe_bias = t->model.moe.bias,
                           .tokenizer = *dt_dataset_tokenizer(t->train)};
}

int dt_run_save(dt_run *t)
{
    char path[DT_CONFIG_PATH + 64];
    if (dt_run_snapshot_settle(t)) return -1; /* not two writes of the state at once */
    if (dt_run_save_to(t, t->cfg->out_dir, t->cfg->keep_last, path, sizeof path)) return -1;
    if (path[0]) fprintf(t->out, "checkpoint %s\n", path);
    return 0;
}
