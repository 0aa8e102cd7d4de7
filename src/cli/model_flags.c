/* The model a command plans or simulates without training it (`dtrain
 * plan`, `dtrain simulate`): its flags go through the trainer's own option
 * table, so the presets and the checks are the trainer's. */
#include <string.h>

#include "cli/cli.h"
#include "core/str.h"

int cli_model_options(char **argv, int *argc, int cap, dt_train_config *c, dt_gpt_config *cfg,
                      int *T, char *err, size_t n)
{
    int named = 0;
    for (int i = 1; i < *argc; i++) named |= !strcmp(argv[i], "--model");
    if (!named && *argc + 2 <= cap) {
        argv[(*argc)++] = "--model";
        argv[(*argc)++] = "gpt2";
    }
    dt_config_defaults(c);
    if (dt_config_parse_args(c, *argc, argv, err, n)) return -1;
    *cfg = (dt_gpt_config){.n_layer = c->n_layer, .n_head = c->n_head, .n_embd = c->n_embd,
                           .vocab_size = c->vocab_size, .block_size = c->block_size};
    memcpy(cfg->blocks, c->blocks, sizeof cfg->blocks);
    dt_config_moe(c, c->num_experts, c->moe_ffn, &cfg->moe);
    dt_config_family(c, cfg);
    if (cfg->moe.experts && !cfg->blocks[0])
        dt_strf(cfg->blocks, sizeof cfg->blocks, "%s", dt_arch_of(cfg)->moe_blocks);
    *T = c->seq_len ? c->seq_len : c->block_size;
    if (cfg->vocab_size < 1)
        return dt_strf(err, n, "the model needs a vocabulary: give --vocab-size N (the tiny "
                       "preset takes its vocabulary from the training data)"), -1;
    if (*T > cfg->block_size)
        return dt_strf(err, n, "--seq-len %d exceeds the block size %d", *T, cfg->block_size),
               -1;
    return dt_gpt_config_check(cfg, err, n);
}
