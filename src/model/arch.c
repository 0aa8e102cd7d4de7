/* The model families' table. See arch.h. */
#include "model/arch.h"

#include <string.h>

#include "model/gpt.h"

static const dt_arch table[DT_ARCH_COUNT] = {
    [DT_ARCH_GPT2] = {DT_ARCH_GPT2, "gpt2", "h.%d.", "wte.weight", "wpe.weight", "ln_f", NULL,
                      "ln_1:layernorm,attn:attention,ln_2:layernorm,mlp:mlp",
                      "ln_1:layernorm,attn:attention,ln_2:layernorm,mlp:moe"},
    [DT_ARCH_LLAMA] = {DT_ARCH_LLAMA, "llama", "model.layers.%d.", "model.embed_tokens.weight", NULL,
                       "model.norm", "lm_head.weight",
                       "input_layernorm:rmsnorm,self_attn:rope_attention,"
                       "post_attention_layernorm:rmsnorm,mlp:swiglu",
                       "input_layernorm:rmsnorm,self_attn:rope_attention,"
                       "post_attention_layernorm:rmsnorm,block_sparse_moe:moe_swiglu"},
};

const dt_arch *dt_arch_of(const dt_gpt_config *cfg)
{
    return cfg->arch > 0 && cfg->arch < DT_ARCH_COUNT ? &table[cfg->arch] : &table[0];
}

const dt_arch *dt_arch_find(const char *name)
{
    for (int i = 0; i < DT_ARCH_COUNT; i++)
        if (!strcmp(table[i].name, name)) return &table[i];
    return NULL;
}

const char *dt_arch_names(void) { return "gpt2|llama"; }

const char *dt_gpt_blocks(const dt_gpt_config *cfg)
{
    const dt_arch *a = dt_arch_of(cfg);
    if (cfg->blocks[0]) return cfg->blocks;
    return cfg->moe.experts && a->moe_blocks ? a->moe_blocks : a->blocks;
}

int dt_gpt_kv_heads(const dt_gpt_config *cfg)
{
    return cfg->n_kv_head > 0 ? cfg->n_kv_head : cfg->n_head;
}

int dt_gpt_ffn(const dt_gpt_config *cfg)
{
    if (cfg->ffn > 0) return cfg->ffn;
    if (cfg->arch != DT_ARCH_LLAMA) return 4 * cfg->n_embd;
    const int f = (int)((8.0 * cfg->n_embd / 3.0 + 255) / 256) * 256; /* Llama's multiple_of */
    return f > 0 ? f : 256;
}

double dt_gpt_rope_theta(const dt_gpt_config *cfg)
{
    return cfg->rope_theta > 0 ? cfg->rope_theta : 10000.0;
}

double dt_gpt_norm_eps(const dt_gpt_config *cfg)
{
    return cfg->norm_eps > 0 ? cfg->norm_eps : 1e-5;
}

int dt_gpt_tied(const dt_gpt_config *cfg) { return cfg->arch != DT_ARCH_LLAMA || cfg->tie; }
