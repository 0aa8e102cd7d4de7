/* Where the model's sizes come from: a checkpoint being resumed, else a
 * weights file (--init), else the configuration. See weights/model_source.h. */
#include "train/weights/model_source.h"

#include <stddef.h>
#include <string.h>

#include "core/log.h"
#include "core/str.h"
#include "train/ckpt/checkpoint.h"
#include "train/weights/hf_dir.h"
#include "train/weights/weights.h"

/* Sizes given explicitly must match the ones a weights file implies. */
static int check_sizes_agree(const dt_train_config *c, const char *source,
                             const dt_gpt_config *mc, char *err, size_t errlen)
{
    const struct { const char *name; int given, want, have; } s[] = {
        {"n_layer", DT_CONFIG_GIVEN(c, n_layer), c->n_layer, mc->n_layer},
        {"n_head", DT_CONFIG_GIVEN(c, n_head), c->n_head, mc->n_head},
        {"n_embd", DT_CONFIG_GIVEN(c, n_embd), c->n_embd, mc->n_embd},
        {"vocab_size", DT_CONFIG_GIVEN(c, vocab_size), c->vocab_size, mc->vocab_size},
        {"block_size", DT_CONFIG_GIVEN(c, block_size), c->block_size, mc->block_size},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        if (s[i].given && s[i].want != s[i].have)
            return dt_strf(err, errlen, "%s has %s %d, but %d was asked for", source, s[i].name,
                           s[i].have, s[i].want), -1;
    }
    if (DT_CONFIG_GIVEN(c, num_experts) && c->num_experts != mc->moe.experts)
        return dt_strf(err, errlen, "%s has %d experts a layer, but --num-experts %d was asked "
                       "for", source, mc->moe.experts, c->num_experts), -1;
    if (DT_CONFIG_GIVEN(c, moe_ffn) && c->moe_ffn != mc->moe.ffn)
        return dt_strf(err, errlen, "%s has experts %d wide, but --moe-ffn-hidden-size %d was "
                       "asked for", source, mc->moe.ffn, c->moe_ffn), -1;
    if (DT_CONFIG_GIVEN(c, blocks) && !dt_blocks_same(c->blocks, mc->blocks))
        return dt_strf(err, errlen, "%s has the blocks \"%s\", but --blocks \"%s\" was asked "
                       "for", source, mc->blocks[0] ? mc->blocks : dt_blocks_gpt2, c->blocks), -1;
    return 0;
}

/* A model directory for --save-final holds only what Hugging Face has an
 * architecture for: known before training, not after it. */
static int save_final_fits(const dt_train_config *c, const dt_gpt_config *mc, char *err,
                           size_t errlen)
{
    char why[512];
    if (!dt_hf_is_dir_path(c->save_final) || dt_hf_check_model(mc, why, sizeof why) == 0)
        return 0;
    return dt_strf(err, errlen, "--save-final %s: %s", c->save_final, why), -1;
}

/* What a Llama-family file's shapes leave open: the key/value heads (from
 * k_proj once the heads are known), the context and the rotary base and
 * norm epsilon (the file's metadata, else the run's flags). */
static int llama_from_file(const dt_train_config *c, const char *source, dt_gpt_config *mc,
                           char *err, size_t errlen)
{
    if (strcmp(c->arch, "llama") && DT_CONFIG_GIVEN(c, arch))
        return dt_strf(err, errlen, "%s holds a Llama-family model, but --arch %s was asked "
                       "for", source, c->arch), -1;
    if (!mc->n_kv_head) mc->n_kv_head = dt_weights_kv_heads(source, mc->n_head, mc->n_embd);
    if (!mc->n_kv_head)
        return dt_strf(err, errlen, "%s: its k_proj [%s] does not hold whole heads of n_embd "
                       "%d / n_head %d", source, "KV x head_dim, n_embd", mc->n_embd,
                       mc->n_head), -1;
    if (DT_CONFIG_GIVEN(c, n_kv_head) && c->n_kv_head != mc->n_kv_head)
        return dt_strf(err, errlen, "%s has %d key/value heads, but --n-kv-head %d was asked "
                       "for", source, mc->n_kv_head, c->n_kv_head), -1;
    if (!mc->block_size) mc->block_size = c->block_size;
    if (!mc->rope_theta || DT_CONFIG_GIVEN(c, rope_theta)) mc->rope_theta = c->rope_theta;
    if (!mc->norm_eps || DT_CONFIG_GIVEN(c, norm_eps)) mc->norm_eps = c->norm_eps;
    if (DT_CONFIG_GIVEN(c, tie) && c->tie != mc->tie)
        return dt_strf(err, errlen, "%s %s an lm_head.weight, but --tie-word-embeddings=%d was "
                       "asked for", source, mc->tie ? "has no" : "has", c->tie), -1;
    return 0;
}

/* A file's sizes, and the head count, which shapes alone do not give. */
static int sizes_from_file(const dt_train_config *c, const char *resume_dir, dt_gpt_config *mc,
                           char *err, size_t errlen)
{
    const char *source = resume_dir ? resume_dir : c->init;
    int rc = resume_dir ? dt_ckpt_model_config(resume_dir, mc, err, errlen)
                        : dt_weights_inspect(c->init, mc, err, errlen);
    if (rc) return -1;
    /* A weights file names its tensors but records no blocks: the ones asked for,
     * or with experts in it GPT-2's with a moe branch. */
    if (!resume_dir) dt_strf(mc->blocks, sizeof mc->blocks, "%s", c->blocks);
    if (!resume_dir && mc->moe.experts && !DT_CONFIG_GIVEN(c, blocks))
        dt_strf(mc->blocks, sizeof mc->blocks, "%s", dt_arch_of(mc)->moe_blocks);
    /* The file gives the experts' shapes; the routing is the run's, but for
     * the top K the file records (a checkpoint's, or a weights file's
     * metadata) when none is given: resuming a top-1 run without repeating
     * the flag must not route to the default 2. */
    const int saved_topk = mc->moe.topk;
    dt_config_moe(c, mc->moe.experts, mc->moe.ffn, &mc->moe);
    if (saved_topk && !DT_CONFIG_GIVEN(c, moe_topk)) mc->moe.topk = saved_topk;
    if (saved_topk && mc->moe.topk != saved_topk)
        DT_WARN("%s was trained with --moe-router-topk %d; this run routes to %d experts a "
                "token, as asked", source, saved_topk, mc->moe.topk);
    if (mc->n_head == 0) {
        /* A wrong head count still runs, silently computing another model. */
        if (!DT_CONFIG_GIVEN(c, n_head) && !DT_CONFIG_GIVEN(c, model))
            return dt_strf(err, errlen,
                           "%s records no n_head (no metadata, no config.json beside it): "
                           "give --n-head",
                           source), -1;
        mc->n_head = c->n_head;
    }
    if (!resume_dir && mc->arch == DT_ARCH_LLAMA && llama_from_file(c, source, mc, err, errlen))
        return -1;
    return check_sizes_agree(c, source, mc, err, errlen);
}

int dt_model_source_config(const dt_train_config *c, const char *resume_dir,
                           const dt_dataset *train, const dt_dataset *val, int *seq_len,
                           dt_gpt_config *mc, char *err, size_t errlen)
{
    memset(mc, 0, sizeof *mc);
    if (resume_dir || c->init[0]) {
        if (sizes_from_file(c, resume_dir, mc, err, errlen)) return -1;
        /* Sequences fill the file's context unless a length was asked for. */
        if (!DT_CONFIG_GIVEN(c, seq_len)) *seq_len = mc->block_size;
    } else {
        mc->n_layer = c->n_layer;
        mc->n_head = c->n_head;
        mc->n_embd = c->n_embd;
        mc->block_size = c->block_size;
        dt_strf(mc->blocks, sizeof mc->blocks, "%s", c->blocks);
        dt_config_moe(c, c->num_experts, c->moe_ffn, &mc->moe);
        dt_config_family(c, mc);
        /* Byte-level data gets the full byte vocabulary, so any text can be sampled. */
        int data_vocab = dt_dataset_vocab(train);
        mc->vocab_size = c->vocab_size > 0 ? c->vocab_size : data_vocab <= 256 ? 256 : data_vocab;
    }
    int need = dt_dataset_vocab(train);
    if (val && dt_dataset_vocab(val) > need) need = dt_dataset_vocab(val);
    if (need > mc->vocab_size)
        return dt_strf(err, errlen,
                       "%s holds token %d, outside the model's vocabulary of %d (set --vocab-size)",
                       dt_dataset_name(train), need - 1, mc->vocab_size), -1;
    if (*seq_len > mc->block_size)
        return dt_strf(err, errlen, "--seq-len %d exceeds the model's block_size %d", *seq_len,
                       mc->block_size), -1;
    /* The family's blocks spelled out: "" stands for GPT-2's everywhere. */
    if (!mc->blocks[0]) dt_strf(mc->blocks, sizeof mc->blocks, "%s", dt_gpt_blocks(mc));
    if (dt_gpt_config_check(mc, err, errlen)) return -1;
    return save_final_fits(c, mc, err, errlen);
}
