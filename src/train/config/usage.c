/* The configuration in words: --help (every option of the table with its
 * default) and the summary a run prints at its start. */
#include <stdio.h>
#include <string.h>

#include "core/str.h"
#include "train/config/internal.h"

static const char *or_dash(const char *s) { return *s ? s : "-"; }

void dt_config_print(const dt_train_config *c, FILE *f)
{
    char vocab[32], val[DT_CONFIG_PATH + 32];
    if (c->vocab_size) dt_strf(vocab, sizeof vocab, "%d", c->vocab_size);
    else dt_strf(vocab, sizeof vocab, "from data");
    if (c->val_data[0]) dt_strf(val, sizeof val, "%s", c->val_data);
    else dt_strf(val, sizeof val, "last %g of data", c->val_fraction);
    /* A model read from a file is named by it: its sizes are the file's,
     * not a preset's. */
    char name[DT_CONFIG_PATH + 32];
    if (c->init[0]) dt_strf(name, sizeof name, "from %s", c->init);
    else if (c->resume_flag) dt_strf(name, sizeof name, "from the checkpoint resumed");
    else dt_strf(name, sizeof name, "%s", or_dash(c->model));
    fprintf(f, "model  %s: n_layer %d, n_head %d, n_embd %d, block_size %d, vocab %s\n", name,
            c->n_layer, c->n_head, c->n_embd, c->block_size, vocab);
    fprintf(f, "data   %s (val: %s), init %s, shuffle %s\n", or_dash(c->data), val,
            or_dash(c->init), c->shuffle ? "on" : "off");
    fprintf(f, "batch  %d seq x %d tokens x %d accum per rank, %ld seq per step\n", c->batch_size,
            c->seq_len ? c->seq_len : c->block_size, c->grad_accum, c->train_batch_size);
    char moments[96];
    if (strcmp(c->optimizer, "sgd"))
        dt_strf(moments, sizeof moments, "betas %g %g, eps %g", c->beta1, c->beta2, c->eps);
    else
        dt_strf(moments, sizeof moments, "momentum %g", c->momentum);
    fprintf(f, "optim  %s lr %g -> %g (%s, warmup %ld), %s, wd %g, clip %g\n", c->optimizer,
            c->lr, c->min_lr, c->lr_schedule, c->warmup_steps, moments, c->weight_decay,
            c->grad_clip);
    fprintf(f, "run    %ld steps, %s, seed %llu, threads %d, zero stage %d, recompute %s, "
            "print every %ld\n", c->steps, c->dtype, c->seed, c->threads, c->zero_stage,
            c->recompute, c->print_every);
    fprintf(f, "eval   every %ld steps (0 = end), %ld batches; out %s, save every %ld, "
            "keep %ld%s%s\n", c->eval_every, c->eval_batches, or_dash(c->out_dir),
            c->save_every, c->keep_last, c->resume_flag ? ", resume " : "",
            c->resume_flag ? or_dash(c->resume) : "");
}

static void usage_option(FILE *f, const dt_train_config *d, const dt_cfg_opt *o)
{
    char left[96], def[64];
    int eq = (o->flags & O_OPTVAL) != 0;
    dt_strf(left, sizeof left, "  --%s%s%s", o->flag, eq || !*o->meta ? "" : " ", o->meta);
    dt_cfg_format_value(o, dt_cfg_read_field(d, o), def, sizeof def);
    if (strlen(left) > 29) fprintf(f, "%s\n%-30s", left, "");
    else fprintf(f, "%-30s", left);
    fprintf(f, "%s%s%s%s\n", o->help, *def ? " [" : "", def, *def ? "]" : "");
}

void dt_config_usage(FILE *f)
{
    dt_train_config d;
    dt_config_defaults(&d);
    fprintf(f, "Training options, as --name VALUE or --name=VALUE; defaults in [].\n"
               "A JSON file given with --config is read first and flags override it.\n");
    for (int g = 0; g < G_COUNT; g++) {
        fprintf(f, "\n%s:\n", dt_cfg_group_titles[g]);
        for (int i = 0; i < dt_cfg_noptions; i++)
            if (dt_cfg_options[i].group == g) usage_option(f, &d, &dt_cfg_options[i]);
    }
    fprintf(f, "\nJSON keys are the option names in snake_case (\"n_layer\": 12) and DeepSpeed's:\n"
               "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps\n"
               "(train_batch_size = micro x accum x ranks; the missing one is inferred),\n"
               "gradient_clipping, steps_per_print, optimizer {type AdamW|Adam|SGD, params},\n"
               "scheduler {type WarmupLR|WarmupDecayLR|WarmupCosineLR, params}, bf16 {enabled},\n"
               "zero_optimization {stage 0-3, reduce_bucket_size, overlap_comm true, the\n"
               "stage3 prefetch, live and persistence thresholds, offload_optimizer,\n"
               "offload_param, zero_quantized_weights, zero_hpz_partition_size,\n"
               "zero_quantized_gradients}, aio, activation_checkpointing {...} (the\n"
               "section turns on --recompute full; its partitioning, CPU offload and\n"
               "profiling keys are refused when on).\n"
               "Not supported yet, refused: fp16, wall_clock_breakdown, log warmup.\n"
               "Integers may be written 1e3.\n"
               "Unknown keys warn. The file holds one JSON object and nothing after it.\n"
               "Schedule: linear warmup to --lr over --warmup-steps, then constant, cosine or\n"
               "linear decay to --min-lr at --steps.\n");
}
