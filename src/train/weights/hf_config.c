/* A model directory's config.json: read against the weights' shapes, and
 * written for Hugging Face's loader. See weights/hf_dir.h. */
#include "train/weights/hf_dir.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/str.h"

typedef struct {
    char path[4200]; /* config.json's, for messages */
    cJSON *root;
} conf;

static const cJSON *item(const conf *c, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->root, key);
    return cJSON_IsNull(j) ? NULL : j; /* null is how Hugging Face writes "unset" */
}

/* A number: 1 found, 0 absent, -1 not a number (err says so). */
static int number(const conf *c, const char *key, double *v, char *err, size_t errlen)
{
    const cJSON *j = item(c, key);
    if (!j) return 0;
    if (!cJSON_IsNumber(j)) return dt_strf(err, errlen, "%s: %s is not a number", c->path, key), -1;
    *v = j->valuedouble;
    return 1;
}

/* A positive integer, or def when absent (def 0: the key is required). */
static int count(const conf *c, const char *key, int def, int *out, char *err, size_t errlen)
{
    double v;
    const int rc = number(c, key, &v, err, errlen);
    if (rc < 0) return -1;
    if (rc == 0 && !def)
        return dt_strf(err, errlen, "%s: no %s, which the model needs", c->path, key), -1;
    if (rc == 0) return *out = def, 0;
    if (!(v >= 1 && v <= INT_MAX && v == floor(v)))
        return dt_strf(err, errlen, "%s: %s %g is not a positive integer", c->path, key, v), -1;
    return *out = (int)v, 0;
}

/* A positive number, or def when absent. */
static int positive(const conf *c, const char *key, double def, double *out, char *err,
                    size_t errlen)
{
    const int rc = number(c, key, out, err, errlen);
    if (rc < 0) return -1;
    if (rc == 0) *out = def;
    if (*out > 0) return 0;
    return dt_strf(err, errlen, "%s: %s %g is not positive", c->path, key, *out), -1;
}

static int boolean(const conf *c, const char *key, int def, int *out, char *err, size_t errlen)
{
    const cJSON *j = item(c, key);
    if (!j) return *out = def, 0;
    if (!cJSON_IsBool(j)) return dt_strf(err, errlen, "%s: %s is not true or false", c->path,
                                         key), -1;
    return *out = cJSON_IsTrue(j), 0;
}

static const char *string(const conf *c, const char *key)
{
    const cJSON *j = item(c, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

/* A size config.json gives and the weights' shapes also say. */
typedef struct {
    const char *key;
    int *have;        /* the shapes' value; config.json's where they say nothing (0) */
    const char *from; /* which shape says it */
} shape_size;

static int check_sizes(const conf *c, const shape_size *s, int n, char *err, size_t errlen)
{
    for (int i = 0; i < n; i++) {
        int v;
        if (count(c, s[i].key, *s[i].have ? *s[i].have : 1, &v, err, errlen)) return -1;
        if (!*s[i].have) *s[i].have = v; /* a tensor that is missing: the load names it */
        if (v != *s[i].have)
            return dt_strf(err, errlen, "%s: %s %d, but the weights have %d (%s)", c->path,
                           s[i].key, v, *s[i].have, s[i].from), -1;
    }
    return 0;
}

/* The heads: they must cut the width into whole heads, and for the Llama
 * family the key/value heads must be what k_proj's rows hold. */
static int heads(const conf *c, const char *key, const char *kv_key, const dt_st_file *f,
                 dt_gpt_config *cfg, char *err, size_t errlen)
{
    if (count(c, key, 0, &cfg->n_head, err, errlen)) return -1;
    if (cfg->n_embd % cfg->n_head)
        return dt_strf(err, errlen, "%s: %s %d does not divide the width %d into whole heads",
                       c->path, key, cfg->n_head, cfg->n_embd), -1;
    if (!kv_key) return 0;
    if (count(c, kv_key, cfg->n_head, &cfg->n_kv_head, err, errlen)) return -1;
    const int D = cfg->n_embd / cfg->n_head;
    const char *kname = "model.layers.0.self_attn.k_proj.weight";
    const dt_st_tensor *k = dt_st_find(f, kname);
    if (k && k->ndim == 2 && k->shape[0] != (int64_t)cfg->n_kv_head * D)
        return dt_strf(err, errlen, "%s: %s %d x head_dim %d = %d rows, but %s is [%lld, %lld]",
                       c->path, kv_key, cfg->n_kv_head, D, cfg->n_kv_head * D, kname,
                       (long long)k->shape[0], (long long)k->shape[1]), -1;
    return 0;
}

static int check_tie(const conf *c, int def, const dt_gpt_config *cfg, char *err, size_t errlen)
{
    int tie;
    if (boolean(c, "tie_word_embeddings", def, &tie, err, errlen)) return -1;
    if (tie == dt_gpt_tied(cfg)) return 0;
    return dt_strf(err, errlen, "%s: tie_word_embeddings %s, but the weights hold %s",
                   c->path, tie ? "true" : "false",
                   cfg->arch == DT_ARCH_LLAMA ? (cfg->tie ? "no lm_head.weight" : "lm_head.weight")
                                              : "a GPT-2 head, which is always wte"), -1;
}

/* What a key set otherwise would make the model compute, refused by name:
 * loading it into dtrain would train another model silently. */
static int refuse(const conf *c, const char *what, const char *why, char *err, size_t errlen)
{
    return dt_strf(err, errlen, "%s: %s, which dtrain does not compute (%s)", c->path, what,
                   why), -1;
}

static int is_true(const conf *c, const char *key) { return cJSON_IsTrue(item(c, key)); }

/* A number that, when given, must be want. */
static int must_be(const conf *c, const char *key, double want, const char *why, char *err,
                   size_t errlen)
{
    double v;
    const int rc = number(c, key, &v, err, errlen);
    if (rc <= 0 || v == want) return rc < 0 ? -1 : 0;
    char what[96];
    dt_strf(what, sizeof what, "%s %g", key, v);
    return refuse(c, what, why, err, errlen);
}

static int llama_refusals(const conf *c, const dt_gpt_config *cfg, char *err, size_t errlen)
{
    const char *act = string(c, "hidden_act");
    char what[96];
    if (act && strcmp(act, "silu")) {
        dt_strf(what, sizeof what, "hidden_act \"%.32s\"", act);
        return refuse(c, what, "the MLP is SwiGLU: \"silu\"", err, errlen);
    }
    if (item(c, "rope_scaling"))
        return refuse(c, "rope_scaling is set", "rotary positions are unscaled: null", err,
                      errlen);
    if (is_true(c, "attention_bias") || is_true(c, "mlp_bias"))
        return refuse(c, is_true(c, "mlp_bias") ? "mlp_bias true" : "attention_bias true",
                      "the family has no biases", err, errlen);
    return must_be(c, "head_dim", cfg->n_embd / cfg->n_head,
                   "a head is hidden_size / num_attention_heads wide", err, errlen);
}

static int gpt2_refusals(const conf *c, const dt_gpt_config *cfg, char *err, size_t errlen)
{
    const char *act = string(c, "activation_function");
    char what[96];
    if (act && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh")) {
        dt_strf(what, sizeof what, "activation_function \"%.32s\"", act);
        return refuse(c, what, "GELU's tanh approximation: \"gelu_new\"", err, errlen);
    }
    if (must_be(c, "layer_norm_epsilon", 1e-5, "LayerNorm's epsilon is 1e-05", err, errlen) ||
        must_be(c, "n_inner", 4.0 * cfg->n_embd, "the MLP is 4 n_embd wide: null", err, errlen))
        return -1;
    if (is_true(c, "scale_attn_by_inverse_layer_idx"))
        return refuse(c, "scale_attn_by_inverse_layer_idx true", "false", err, errlen);
    if (cJSON_IsFalse(item(c, "scale_attn_weights")))
        return refuse(c, "scale_attn_weights false", "true", err, errlen);
    return 0;
}

/* The Llama family's keys: the sizes s[0..n) against the shapes, the
 * heads, the tie, what it does not compute, and the context, rotary base
 * and norm epsilon with the family's config class's defaults. */
static int read_family(const conf *c, const dt_st_file *f, dt_gpt_config *cfg,
                       const shape_size *s, int n, int ctx, double theta, double eps, char *err,
                       size_t errlen)
{
    if (check_sizes(c, s, n, err, errlen) ||
        heads(c, "num_attention_heads", "num_key_value_heads", f, cfg, err, errlen) ||
        check_tie(c, 0, cfg, err, errlen) || llama_refusals(c, cfg, err, errlen))
        return -1;
    return count(c, "max_position_embeddings", ctx, &cfg->block_size, err, errlen) ||
                   positive(c, "rope_theta", theta, &cfg->rope_theta, err, errlen) ||
                   positive(c, "rms_norm_eps", eps, &cfg->norm_eps, err, errlen)
               ? -1
               : 0;
}

static int read_llama(const conf *c, const dt_st_file *f, dt_gpt_config *cfg, char *err,
                      size_t errlen)
{
    const shape_size s[] = {
        {"vocab_size", &cfg->vocab_size, "model.embed_tokens.weight's rows"},
        {"hidden_size", &cfg->n_embd, "model.embed_tokens.weight's columns"},
        {"num_hidden_layers", &cfg->n_layer, "the model.layers.{i} in the files"},
        {"intermediate_size", &cfg->ffn, "model.layers.0.mlp.gate_proj.weight's rows"},
    };
    return read_family(c, f, cfg, s, 4, 2048, 10000.0, 1e-6, err, errlen); /* LlamaConfig's */
}

/* Mixtral: the Llama family whose MLP is E SwiGLU experts and a router,
 * intermediate_size each expert's width. A sliding window shorter than
 * the context would mask keys dtrain's attention sees. */
static int read_mixtral(const conf *c, const dt_st_file *f, dt_gpt_config *cfg, char *err,
                        size_t errlen)
{
    const shape_size s[] = {
        {"vocab_size", &cfg->vocab_size, "model.embed_tokens.weight's rows"},
        {"hidden_size", &cfg->n_embd, "model.embed_tokens.weight's columns"},
        {"num_hidden_layers", &cfg->n_layer, "the model.layers.{i} in the files"},
        {"intermediate_size", &cfg->moe.ffn, "block_sparse_moe.experts.0.w1.weight's rows"},
        {"num_local_experts", &cfg->moe.experts, "block_sparse_moe.gate.weight's rows"},
    };
    double window;
    if (read_family(c, f, cfg, s, 5, 4096 * 32, 1e6, 1e-5, err, errlen) || /* MixtralConfig's */
        count(c, "num_experts_per_tok", 2, &cfg->moe.topk, err, errlen))
        return -1;
    if (cfg->moe.topk > cfg->moe.experts)
        return dt_strf(err, errlen, "%s: num_experts_per_tok %d is more than num_local_experts "
                       "%d", c->path, cfg->moe.topk, cfg->moe.experts), -1;
    const int rc = number(c, "sliding_window", &window, err, errlen);
    if (rc < 0) return -1;
    if (rc > 0 && window < cfg->block_size) {
        char what[96];
        dt_strf(what, sizeof what, "sliding_window %g", window);
        return refuse(c, what, "attention sees every earlier position: null", err, errlen);
    }
    return 0;
}

static int read_gpt2(const conf *c, const dt_st_file *f, dt_gpt_config *cfg, char *err,
                     size_t errlen)
{
    const shape_size s[] = {
        {"vocab_size", &cfg->vocab_size, "wte.weight's rows"},
        {"n_embd", &cfg->n_embd, "wte.weight's columns"},
        {"n_layer", &cfg->n_layer, "the h.{i} in the files"},
        {"n_positions", &cfg->block_size, "wpe.weight's rows"},
    };
    return check_sizes(c, s, 4, err, errlen) || heads(c, "n_head", NULL, f, cfg, err, errlen) ||
                   check_tie(c, 1, cfg, err, errlen) || gpt2_refusals(c, cfg, err, errlen)
               ? -1
               : 0;
}

static int is_mixtral(const conf *c)
{
    const char *type = string(c, "model_type");
    return type && !strcmp(type, "mixtral");
}

/* model_type names the family; the weights' names must be that family's,
 * with experts for Mixtral ("mixtral": the Llama family's names) and
 * without for Llama. */
static int check_family(const conf *c, const dt_gpt_config *cfg, char *err, size_t errlen)
{
    const char *type = string(c, "model_type");
    if (!type) return 0; /* old files lack it: the names decide */
    const dt_arch *a = is_mixtral(c) ? dt_arch_find("llama") : dt_arch_find(type);
    if (!a)
        return dt_strf(err, errlen, "%s: model_type \"%.40s\"; dtrain reads \"llama\", "
                       "\"mixtral\" and \"gpt2\" model directories", c->path, type), -1;
    if ((int)a->kind == cfg->arch && a->kind == DT_ARCH_LLAMA &&
        is_mixtral(c) != (cfg->moe.experts > 0))
        return dt_strf(err, errlen, "%s: model_type \"%s\", but the weights have %s "
                       "(model.layers.0.block_sparse_moe.gate.weight)", c->path, type,
                       cfg->moe.experts ? "experts" : "no experts"), -1;
    if ((int)a->kind == cfg->arch) return 0;
    return dt_strf(err, errlen, "%s: model_type \"%s\", but the weights are named as the %s "
                   "family's (%s)", c->path, type, dt_arch_of(cfg)->name,
                   dt_arch_of(cfg)->tokens), -1;
}

int dt_hf_config_read(const char *dir, const dt_st_file *f, dt_gpt_config *cfg, char *err,
                      size_t errlen)
{
    conf c;
    dt_hf_path(c.path, sizeof c.path, dir, DT_HF_CONFIG);
    char *text = dt_read_file(c.path, 1 << 20, NULL, err, errlen);
    if (!text) return -1;
    c.root = cJSON_Parse(text);
    free(text);
    int rc = -1;
    if (!cJSON_IsObject(c.root))
        dt_strf(err, errlen, "%s: not a JSON object", c.path);
    else if (check_family(&c, cfg, err, errlen) == 0)
        rc = cfg->arch != DT_ARCH_LLAMA ? read_gpt2(&c, f, cfg, err, errlen)
             : cfg->moe.experts         ? read_mixtral(&c, f, cfg, err, errlen)
                                        : read_llama(&c, f, cfg, err, errlen);
    cJSON_Delete(c.root);
    return rc;
}

/* ---- writing ------------------------------------------------------------- */

/* "architectures": the class from_pretrained builds, a list of one. */
static void add_class(cJSON *o, const char *name)
{
    cJSON *list = cJSON_AddArrayToObject(o, "architectures");
    if (list) cJSON_AddItemToArray(list, cJSON_CreateString(name));
}

/* The Llama family's keys; with experts, Mixtral's (intermediate_size is
 * then an expert's width). */
static void add_llama(cJSON *o, const dt_gpt_config *cfg)
{
    const int moe = cfg->moe.experts > 0;
    add_class(o, moe ? "MixtralForCausalLM" : "LlamaForCausalLM");
    cJSON_AddStringToObject(o, "model_type", moe ? "mixtral" : "llama");
    cJSON_AddNumberToObject(o, "vocab_size", cfg->vocab_size);
    cJSON_AddNumberToObject(o, "hidden_size", cfg->n_embd);
    cJSON_AddNumberToObject(o, "intermediate_size", moe ? cfg->moe.ffn : dt_gpt_ffn(cfg));
    if (moe) {
        cJSON_AddNumberToObject(o, "num_local_experts", cfg->moe.experts);
        cJSON_AddNumberToObject(o, "num_experts_per_tok", cfg->moe.topk);
        cJSON_AddNullToObject(o, "sliding_window");
    }
    cJSON_AddNumberToObject(o, "num_hidden_layers", cfg->n_layer);
    cJSON_AddNumberToObject(o, "num_attention_heads", cfg->n_head);
    cJSON_AddNumberToObject(o, "num_key_value_heads", dt_gpt_kv_heads(cfg));
    cJSON_AddNumberToObject(o, "head_dim", cfg->n_embd / cfg->n_head);
    cJSON_AddNumberToObject(o, "max_position_embeddings", cfg->block_size);
    cJSON_AddNumberToObject(o, "rope_theta", dt_gpt_rope_theta(cfg));
    cJSON_AddNumberToObject(o, "rms_norm_eps", dt_gpt_norm_eps(cfg));
    cJSON_AddBoolToObject(o, "tie_word_embeddings", cfg->tie);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddBoolToObject(o, "attention_bias", 0);
    cJSON_AddBoolToObject(o, "mlp_bias", 0);
    cJSON_AddNullToObject(o, "rope_scaling");
}

static void add_gpt2(cJSON *o, const dt_gpt_config *cfg)
{
    add_class(o, "GPT2LMHeadModel");
    cJSON_AddStringToObject(o, "model_type", "gpt2");
    cJSON_AddNumberToObject(o, "vocab_size", cfg->vocab_size);
    cJSON_AddNumberToObject(o, "n_positions", cfg->block_size);
    cJSON_AddNumberToObject(o, "n_embd", cfg->n_embd);
    cJSON_AddNumberToObject(o, "n_layer", cfg->n_layer);
    cJSON_AddNumberToObject(o, "n_head", cfg->n_head);
    cJSON_AddNullToObject(o, "n_inner");
    cJSON_AddStringToObject(o, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(o, "layer_norm_epsilon", 1e-5);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", 1);
}

int dt_hf_check_model(const dt_gpt_config *cfg, char *err, size_t errlen)
{
    const dt_arch *a = dt_arch_of(cfg);
    /* Mixtral: the Llama family with experts */
    const char *want = cfg->moe.experts && a->kind == DT_ARCH_LLAMA ? a->moe_blocks : a->blocks;
    if (dt_blocks_same(dt_gpt_blocks(cfg), want) && (!cfg->moe.experts || want == a->moe_blocks))
        return 0;
    return dt_strf(err, errlen, "a model of the blocks \"%s\" has no Hugging Face "
                   "architecture (%s's are \"%s\"%s); write a .safetensors file instead",
                   dt_gpt_blocks(cfg), a->name, a->blocks,
                   a->kind == DT_ARCH_LLAMA ? ", Mixtral's the same with "
                                              "\"block_sparse_moe:moe_swiglu\"" : ""), -1;
}

char *dt_hf_config_text(const dt_gpt_config *cfg, const char *torch_dtype, char *err,
                        size_t errlen)
{
    if (dt_hf_check_model(cfg, err, errlen)) return NULL;
    cJSON *o = cJSON_CreateObject();
    if (o && cfg->arch == DT_ARCH_LLAMA) add_llama(o, cfg);
    if (o && cfg->arch != DT_ARCH_LLAMA) add_gpt2(o, cfg);
    cJSON_AddStringToObject(o, "torch_dtype", torch_dtype);
    char *text = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!text) dt_strf(err, errlen, "out of memory for " DT_HF_CONFIG);
    return text;
}
