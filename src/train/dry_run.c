/* A configuration's memory plan without training. See dry_run.h. */
#include "train/dry_run.h"

#include <string.h>

#include "core/str.h"
#include "parallel/registry.h"
#include "train/ckpt/checkpoint.h"
#include "train/data/corpus.h"
#include "train/memory/plan_places.h"
#include "train/weights/model_source.h"

int dt_dry_run_check(dt_train_config *c, int world, char *err, size_t n)
{
    int dp;
    if (dt_config_data_parallel_size(c, world, &dp, err, n) || dt_config_validate(c, dp, err, n))
        return -1;
    const dt_strategy_kind *kind = dt_strategy_find(c->strategy);
    if (!kind->places)
        return dt_strf(err, n, "--dry-run prints what a strategy says each rank holds, and "
                       "--strategy %s says nothing of it: run it with --steps 1, whose peak "
                       "memory table at the end is each rank's, measured; or plan the model "
                       "with --strategy ddp", c->strategy), -1;
    if (c->pp > 1 && strcmp(c->pp_partition, "cost") == 0)
        return dt_strf(err, n, "--dry-run with --pp-partition cost: the cut depends on times "
                       "measured when the run starts; plan with uniform or params"), -1;
    return 0;
}

/* The model's sizes as a run resolves them: from --resume's checkpoint or
 * --init's file, else the configuration, with the vocabulary the data
 * needs. The data files are opened, not read. */
static int resolve_model(dt_train_config *c, dt_gpt_config *mc, char *err, size_t n)
{
    char resume_dir[DT_CONFIG_PATH + 64], train_file[DT_CONFIG_PATH], val_file[DT_CONFIG_PATH];
    if (c->resume_flag && dt_ckpt_resolve(c->resume[0] ? c->resume : c->out_dir, resume_dir,
                                          sizeof resume_dir, err, n))
        return -1;
    if (dt_data_files(c->data, c->val_data, train_file, val_file, sizeof train_file, err, n))
        return -1;
    dt_dataset *train = NULL, *val = NULL;
    int rc = dt_dataset_open(train_file, &train, err, n);
    if (rc == 0 && val_file[0]) rc = dt_dataset_open(val_file, &val, err, n);
    if (rc == 0)
        rc = dt_model_source_config(c, c->resume_flag ? resume_dir : NULL, train, val,
                                    &c->seq_len, mc, err, n);
    if (train) dt_dataset_close(train);
    if (val) dt_dataset_close(val);
    return rc;
}

int dt_dry_run_places(const dt_train_config *c, const dt_gpt *layout, int world, dt_places *pl,
                      char *err, size_t n)
{
    const dt_strategy_kind *kind = dt_strategy_find(c->strategy);
    dt_parallel_opts o = dt_config_parallel_opts(c);
    dt_places_job job = {&o, layout, world, c->batch_size,
                         c->seq_len ? c->seq_len : layout->cfg.block_size};
    if (kind->places(&job, pl, err, n)) return -1;
    long ranks = 0;
    for (int i = 0; i < pl->n; i++) ranks += pl->at[i].ranks;
    if (pl->n < 1 || ranks != world) {
        dt_places_free(pl);
        return dt_strf(err, n, "--strategy %s says its places hold %ld ranks, but the job has "
                       "%d (a bug in its places hook)", c->strategy, ranks, world), -1;
    }
    return 0;
}

int dt_dry_run(dt_train_config *c, int world, FILE *out, char *err, size_t n)
{
    dt_gpt_config mc;
    dt_gpt layout;
    memset(&mc, 0, sizeof mc); /* a field no source sets stays empty */
    if (resolve_model(c, &mc, err, n)) return -1;
    dt_precision prec = strcmp(c->dtype, "bf16") == 0 ? DT_PREC_BF16 : DT_PREC_F32;
    if (dt_gpt_create_layout(&layout, &mc, prec, err, n)) return -1;
    /* The recompute mode, set on the layout as the trainer sets it, so
     * that the activations follow it. */
    if (dt_recompute_parse(c->recompute, &layout.acts.recompute)) {
        dt_gpt_destroy(&layout);
        return dt_strf(err, n, "unknown --recompute '%s'", c->recompute), -1;
    }
    if (out)
        fprintf(out, "dry run (nothing trained, nothing large allocated): %s%s%d layers, %d "
                "heads, %d embd, vocab %d, block %d\n", c->model, c->model[0] ? ": " : "",
                mc.n_layer, mc.n_head, mc.n_embd, mc.vocab_size, mc.block_size);
    dt_places pl;
    int rc = dt_dry_run_places(c, &layout, world, &pl, err, n);
    if (rc == 0) {
        rc = dt_mem_plan_places_print(out, &layout, c, &pl, err, n);
        dt_places_free(&pl);
    }
    dt_gpt_destroy(&layout);
    return rc;
}
