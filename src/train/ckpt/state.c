/* state.json written and checked. See ckpt/state.h. */
#include "train/ckpt/state.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "core/file.h"
#include "core/parse.h"
#include "core/str.h"

/* The largest integer a JSON number (a double) holds exactly. */
#define JSON_INT_MAX ((long long)DT_CKPT_STEP_MAX)

/* ---- writing ---------------------------------------------------------- */

static void add_u64(cJSON *j, const char *key, uint64_t v)
{
    char buf[32];
    dt_strf(buf, sizeof buf, "%llu", (unsigned long long)v);
    cJSON_AddStringToObject(j, key, buf);
}

/* Each layer's bias as one string of E words, a float's bits in 8
 * hexadecimal digits each; NULL when memory runs out. */
static cJSON *moe_bias_json(const float *bias, int L, int E)
{
    const size_t len = (size_t)E * 9; /* E words, E - 1 spaces and the end */
    cJSON *a = cJSON_CreateArray();
    char *line = malloc(len);
    for (int l = 0; a && line && l < L; l++) {
        size_t at = 0;
        for (int e = 0; e < E; e++) {
            uint32_t u;
            memcpy(&u, bias + (size_t)l * E + e, sizeof u);
            at += (size_t)snprintf(line + at, len - at, e ? " %08" PRIx32 : "%08" PRIx32, u);
        }
        cJSON *s = cJSON_CreateString(line);
        if (!s || !cJSON_AddItemToArray(a, s)) {
            cJSON_Delete(s);
            cJSON_Delete(a);
            a = NULL;
        }
    }
    free(line);
    if (line) return a;
    cJSON_Delete(a);
    return NULL;
}

/* The tokenizer's record, or NULL when memory runs out. */
static cJSON *tokenizer_json(const dt_tok_ref *t)
{
    cJSON *o = cJSON_CreateObject();
    char fp[17];
    dt_strf(fp, sizeof fp, "%016" PRIx64, t->fingerprint);
    if (o && cJSON_AddStringToObject(o, "spec", t->spec) &&
        cJSON_AddStringToObject(o, "split", dt_split_name(t->split)) &&
        cJSON_AddNumberToObject(o, "eot", t->eot) &&
        cJSON_AddNumberToObject(o, "vocab", t->vocab) &&
        cJSON_AddStringToObject(o, "fingerprint", fp))
        return o;
    cJSON_Delete(o);
    return NULL;
}

cJSON *dt_ckpt_state_json(const dt_ckpt_record *r)
{
    const dt_ckpt_state *s = &r->run;
    cJSON *j = cJSON_CreateObject();
    cJSON *model = cJSON_CreateObject();
    if (!j || !model) {
        cJSON_Delete(model);
        cJSON_Delete(j);
        return NULL;
    }
    cJSON_AddNumberToObject(j, "format", DT_CKPT_FORMAT);
    cJSON_AddNumberToObject(j, "step", (double)s->step);
    add_u64(j, "seq_counter", s->seq_counter);
    add_u64(j, "seed", s->seed);
    cJSON_AddNumberToObject(j, "shuffle", s->shuffle);
    cJSON_AddNumberToObject(j, "seq_len", s->seq_len);
    cJSON_AddNumberToObject(j, "global_batch", (double)s->global_batch);
    cJSON_AddNumberToObject(j, "last_loss", s->last_loss); /* null when not finite */
    add_u64(j, "data_tokens", s->data_tokens);
    cJSON_AddStringToObject(j, "optimizer", dt_opt_kind_name(r->optimizer));
    cJSON_AddNumberToObject(j, "optimizer_step", (double)r->optimizer_step);
    cJSON_AddNumberToObject(model, "n_layer", r->model.n_layer);
    cJSON_AddNumberToObject(model, "n_head", r->model.n_head);
    cJSON_AddNumberToObject(model, "n_embd", r->model.n_embd);
    cJSON_AddNumberToObject(model, "vocab_size", r->model.vocab_size);
    cJSON_AddNumberToObject(model, "block_size", r->model.block_size);
    char blocks[sizeof r->model.blocks + 64];
    dt_blocks_canonical(dt_gpt_blocks(&r->model), blocks, sizeof blocks);
    cJSON_AddStringToObject(model, "blocks", blocks);
    if (r->model.arch == DT_ARCH_LLAMA) { /* the family's options, as it resolved them */
        cJSON_AddStringToObject(model, "arch", dt_arch_of(&r->model)->name);
        cJSON_AddNumberToObject(model, "n_kv_head", dt_gpt_kv_heads(&r->model));
        cJSON_AddNumberToObject(model, "ffn_hidden_size", dt_gpt_ffn(&r->model));
        cJSON_AddNumberToObject(model, "rope_theta", dt_gpt_rope_theta(&r->model));
        cJSON_AddNumberToObject(model, "norm_eps", dt_gpt_norm_eps(&r->model));
        cJSON_AddBoolToObject(model, "tie_word_embeddings", dt_gpt_tied(&r->model));
    }
    if (r->model.moe.experts) {
        cJSON_AddNumberToObject(model, "num_experts", r->model.moe.experts);
        cJSON_AddNumberToObject(model, "moe_ffn_hidden_size", r->model.moe.ffn);
        cJSON_AddNumberToObject(model, "moe_router_topk", r->model.moe.topk);
    }
    cJSON_AddItemToObject(j, "model", model);
    if (r->run.tokenizer.spec[0]) {
        cJSON *tok = tokenizer_json(&r->run.tokenizer);
        if (!tok || !cJSON_AddItemToObject(j, "tokenizer", tok)) {
            cJSON_Delete(tok);
            cJSON_Delete(j);
            return NULL;
        }
    }
    if (!r->run.moe_bias || !r->model.moe.experts) return j;
    cJSON *bias = moe_bias_json(r->run.moe_bias, r->model.n_layer, r->model.moe.experts);
    if (bias) {
        cJSON_AddItemToObject(j, "moe_expert_bias", bias);
        return j;
    }
    cJSON_Delete(j);
    return NULL;
}

char *dt_ckpt_state_format(const dt_ckpt_record *r)
{
    cJSON *j = dt_ckpt_state_json(r);
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    return text;
}

/* ---- reading ---------------------------------------------------------- */

typedef struct {
    const char *path;
    const char *prefix; /* before a key in messages: "" or "model." */
    char *err;
    size_t errlen;
} reader;

/* PATH: "KEY" is VALUE; it must be WANT. The value is shown as JSON, so a
 * string shows its quotes. */
static int bad(const reader *rd, const char *key, const cJSON *v, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int bad(const reader *rd, const char *key, const cJSON *v, const char *fmt, ...)
{
    char want[160];
    va_list ap;
    va_start(ap, fmt);
    dt_vstrf(want, sizeof want, fmt, ap);
    va_end(ap);
    char *shown = v ? cJSON_PrintUnformatted(v) : NULL;
    if (!v)
        dt_strf(rd->err, rd->errlen, "%s: \"%s%s\" is missing (it must be %s)", rd->path,
                rd->prefix, key, want);
    else
        dt_strf(rd->err, rd->errlen, "%s: \"%s%s\" is %.40s; it must be %s", rd->path,
                rd->prefix, key, shown ? shown : "?", want);
    free(shown);
    return -1;
}

static int get_int(const reader *rd, const cJSON *obj, const char *key, long long lo,
                   long long hi, long long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (d >= (double)lo && d <= (double)hi && d == floor(d)) {
        *out = (long long)d;
        return 0;
    }
    return bad(rd, key, v, "an integer from %lld to %lld", lo, hi);
}

static int get_long(const reader *rd, const cJSON *obj, const char *key, long long lo,
                    long long hi, long *out)
{
    long long v = 0;
    if (get_int(rd, obj, key, lo, hi, &v) != 0) return -1;
    *out = (long)v;
    return 0;
}

static int get_i32(const reader *rd, const cJSON *obj, const char *key, long long lo,
                   long long hi, int *out)
{
    long long v = 0;
    if (get_int(rd, obj, key, lo, hi, &v) != 0) return -1;
    *out = (int)v;
    return 0;
}

/* A decimal string; a JSON number is taken too when it is exact. An
 * optional field that is absent reads as 0. */
static int get_u64(const reader *rd, const cJSON *obj, const char *key, uint64_t hi,
                   int optional, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = 0;
    if (!v && optional) return 0;
    if (cJSON_IsString(v) && dt_parse_u64(v->valuestring, hi, out) == 0) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (d >= 0 && d <= (double)JSON_INT_MAX && d == floor(d) && (uint64_t)d <= hi) {
        *out = (uint64_t)d;
        return 0;
    }
    return bad(rd, key, v, "an integer from 0 to %llu (as a decimal string)",
               (unsigned long long)hi);
}

/* A diverged loss is written as null. */
static int get_loss(const reader *rd, const cJSON *obj, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "last_loss");
    if (cJSON_IsNull(v)) {
        *out = NAN;
        return 0;
    }
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) {
        *out = v->valuedouble;
        return 0;
    }
    return bad(rd, "last_loss", v, "a number, or null");
}

static int get_optimizer(const reader *rd, const cJSON *obj, dt_opt_kind *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "optimizer");
    if (cJSON_IsString(v) && dt_opt_kind_parse(v->valuestring, out) == 0) return 0;
    return bad(rd, "optimizer", v, "%s, %s or %s", dt_opt_kind_name(DT_OPT_ADAMW),
               dt_opt_kind_name(DT_OPT_ADAM), dt_opt_kind_name(DT_OPT_SGD));
}

static int get_format(const reader *rd, const cJSON *obj)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "format");
    if (cJSON_IsNumber(v) && v->valuedouble == DT_CKPT_FORMAT) return 0;
    if (!v) return bad(rd, "format", v, "%d", DT_CKPT_FORMAT);
    char *shown = cJSON_PrintUnformatted(v);
    dt_strf(rd->err, rd->errlen, "%s: \"format\" is %.40s; this dtrain reads format %d", rd->path,
            shown ? shown : "?", DT_CKPT_FORMAT);
    free(shown);
    return -1;
}

/* A layer's blocks, recorded since the model became blocks (absent: GPT-2's). */
static int get_blocks(const reader *rd, const cJSON *obj, dt_gpt_config *cfg)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "blocks");
    if (!v) return 0;
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= sizeof cfg->blocks)
        return bad(rd, "blocks", v, "a string of name:kind pairs");
    dt_strf(cfg->blocks, sizeof cfg->blocks, "%s", v->valuestring);
    return 0;
}

/* The experts, recorded for a model with them (absent: dense). */
static int get_experts(const reader *rd, const cJSON *obj, dt_gpt_config *cfg)
{
    if (!cJSON_GetObjectItemCaseSensitive(obj, "num_experts")) return 0;
    return get_i32(rd, obj, "num_experts", 1, DT_MOE_MAX_EXPERTS, &cfg->moe.experts) ||
           get_i32(rd, obj, "moe_ffn_hidden_size", 0, INT_MAX, &cfg->moe.ffn) ||
           get_i32(rd, obj, "moe_router_topk", 1, DT_MOE_MAX_EXPERTS, &cfg->moe.topk);
}

static int get_positive(const reader *rd, const cJSON *obj, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
        return bad(rd, key, v, "a positive number");
    *out = v->valuedouble;
    return 0;
}

/* The family, recorded for any but GPT-2 (absent: GPT-2). */
static int get_family(const reader *rd, const cJSON *obj, dt_gpt_config *cfg)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(obj, "arch"), *tie;
    if (!a) return 0;
    const dt_arch *f = cJSON_IsString(a) ? dt_arch_find(a->valuestring) : NULL;
    if (!f) return bad(rd, "arch", a, "a model family (%s)", dt_arch_names());
    cfg->arch = (int)f->kind;
    if (cfg->arch != DT_ARCH_LLAMA) return 0;
    tie = cJSON_GetObjectItemCaseSensitive(obj, "tie_word_embeddings");
    if (!cJSON_IsBool(tie)) return bad(rd, "tie_word_embeddings", tie, "true or false");
    cfg->tie = cJSON_IsTrue(tie);
    return get_i32(rd, obj, "n_kv_head", 1, INT_MAX, &cfg->n_kv_head) ||
           get_i32(rd, obj, "ffn_hidden_size", 1, INT_MAX, &cfg->ffn) ||
           get_positive(rd, obj, "rope_theta", &cfg->rope_theta) ||
           get_positive(rd, obj, "norm_eps", &cfg->norm_eps);
}

/* The model's sizes, when recorded; they must also make a model. */
static int get_model(const reader *rd, const cJSON *obj, dt_gpt_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(obj, "model");
    if (!m) return 0;
    if (!cJSON_IsObject(m)) return bad(rd, "model", m, "an object of the model's sizes");
    reader sub = *rd;
    sub.prefix = "model.";
    if (get_i32(&sub, m, "n_layer", 1, INT_MAX, &cfg->n_layer) ||
        get_i32(&sub, m, "n_head", 1, INT_MAX, &cfg->n_head) ||
        get_i32(&sub, m, "n_embd", 1, INT_MAX, &cfg->n_embd) ||
        get_i32(&sub, m, "vocab_size", 1, INT_MAX, &cfg->vocab_size) ||
        get_i32(&sub, m, "block_size", 1, INT_MAX, &cfg->block_size) ||
        get_blocks(&sub, m, cfg) || get_family(&sub, m, cfg) || get_experts(&sub, m, cfg))
        return -1;
    char why[256];
    if (dt_gpt_config_check(cfg, why, sizeof why) == 0) return 0;
    dt_strf(rd->err, rd->errlen, "%s: \"model\" does not describe a model: %s", rd->path, why);
    return -1;
}

/* Words of a string apart by single spaces. */
static int count_words(const char *s)
{
    int n = *s != 0;
    for (; *s; s++) n += *s == ' ';
    return n;
}

/* Word e of layer l's string (at p) into *out: 8 hexadecimal digits, the
 * bits of a finite float. */
static int get_bias_word(const reader *rd, const char *p, int l, int e, float *out)
{
    char word[9] = {0};
    const size_t k = strspn(p, "0123456789abcdefABCDEF");
    memcpy(word, p, k < 8 ? k : 8);
    if (k != 8 || (p[8] != ' ' && p[8] != 0))
        return dt_strf(rd->err, rd->errlen, "%s: \"moe_expert_bias\"[%d] value %d is \"%.12s\"; "
                       "it must be 8 hexadecimal digits (a float's bits)", rd->path, l, e,
                       p), -1;
    const uint32_t u = (uint32_t)strtoul(word, NULL, 16);
    float x;
    memcpy(&x, &u, sizeof x);
    if (isfinite(x)) return *out = x, 0;
    return dt_strf(rd->err, rd->errlen, "%s: \"moe_expert_bias\"[%d] value %d is %s (%s); the "
                   "experts' bias must be finite", rd->path, l, e, word,
                   isnan(x) ? "nan" : "inf"), -1;
}

/* The experts' bias, when recorded: one string per layer of the model,
 * each of its E words. Its values go to out[n_layer][E] when out is not
 * NULL; their count to r->moe_bias_n. */
static int get_moe_bias(const reader *rd, const cJSON *obj, dt_ckpt_record *r, float *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "moe_expert_bias");
    const int L = r->model.n_layer, E = r->model.moe.experts;
    r->moe_bias_n = 0;
    if (!v) return 0;
    if (!cJSON_IsArray(v))
        return bad(rd, "moe_expert_bias", v, "an array of strings, one per layer");
    if (E == 0)
        return dt_strf(rd->err, rd->errlen, "%s: \"moe_expert_bias\" is recorded, but \"model\" "
                       "records no experts (\"num_experts\")", rd->path), -1;
    if (cJSON_GetArraySize(v) != L)
        return dt_strf(rd->err, rd->errlen, "%s: \"moe_expert_bias\" holds %d layers; the model "
                       "has %d (\"model.n_layer\")", rd->path, cJSON_GetArraySize(v), L), -1;
    int l = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, v) {
        if (!cJSON_IsString(s))
            return bad(rd, "moe_expert_bias", s, "a string of a layer's values");
        const int n = count_words(s->valuestring);
        if (n != E)
            return dt_strf(rd->err, rd->errlen, "%s: \"moe_expert_bias\"[%d] holds %d values; the "
                           "model has %d experts a layer (\"model.num_experts\")", rd->path, l,
                           n, E), -1;
        for (int e = 0; e < E; e++) {
            float x;
            if (get_bias_word(rd, s->valuestring + (size_t)e * 9, l, e, &x)) return -1;
            if (out) out[(size_t)l * E + e] = x;
        }
        l++;
    }
    r->moe_bias_n = (size_t)L * E;
    return 0;
}

/* The data's tokenizer, when recorded. */
static int get_tokenizer(const reader *rd, const cJSON *obj, dt_tok_ref *t)
{
    memset(t, 0, sizeof *t);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(obj, "tokenizer");
    if (!o) return 0;
    if (!cJSON_IsObject(o)) return bad(rd, "tokenizer", o, "an object naming the tokenizer");
    reader sub = *rd;
    sub.prefix = "tokenizer.";
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(o, "spec");
    const cJSON *split = cJSON_GetObjectItemCaseSensitive(o, "split");
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(o, "fingerprint");
    if (!cJSON_IsString(spec) || !spec->valuestring[0] ||
        strlen(spec->valuestring) >= sizeof t->spec)
        return bad(&sub, "spec", spec, "bytes, gpt2 or a path of under %zu bytes", sizeof t->spec);
    dt_strf(t->spec, sizeof t->spec, "%s", spec->valuestring);
    if (cJSON_IsString(split) && strcmp(split->valuestring, "none") == 0)
        t->split = DT_SPLIT_NONE;
    else if (!cJSON_IsString(split) || dt_split_parse(split->valuestring, &t->split) != 0)
        return bad(&sub, "split", split, "none, gpt2 or cl100k");
    if (!cJSON_IsString(fp) || strlen(fp->valuestring) != 16 ||
        strspn(fp->valuestring, "0123456789abcdef") != 16)
        return bad(&sub, "fingerprint", fp, "16 hexadecimal digits");
    t->fingerprint = strtoull(fp->valuestring, NULL, 16);
    return get_i32(&sub, o, "vocab", 1, INT_MAX, &t->vocab) ||
           get_i32(&sub, o, "eot", -1, t->vocab - 1, &t->eot);
}

/* Relations between fields that every run keeps: each step consumes at
 * least one sequence. (The optimizer's step count is not tied to the
 * step: an asynchronous parameter server updates once per worker push.) */
static int check_relations(const reader *rd, const dt_ckpt_state *s)
{
    if (s->seq_counter >= (uint64_t)s->step) return 0;
    dt_strf(rd->err, rd->errlen,
            "%s: \"seq_counter\" is %llu, fewer than the %ld steps taken (each takes at least "
            "one sequence)",
            rd->path, (unsigned long long)s->seq_counter, s->step);
    return -1;
}

static int parse_object(const reader *rd, const cJSON *j, dt_ckpt_record *r)
{
    dt_ckpt_state *s = &r->run;
    /* The optimizer kernels count steps in an int, and add one. */
    if (get_format(rd, j) || get_long(rd, j, "step", 0, JSON_INT_MAX, &s->step) ||
        get_u64(rd, j, "seq_counter", INT64_MAX, 0, &s->seq_counter) ||
        get_u64(rd, j, "seed", UINT64_MAX, 0, &s->seed) ||
        get_i32(rd, j, "shuffle", 0, 1, &s->shuffle) ||
        get_i32(rd, j, "seq_len", 1, INT_MAX, &s->seq_len) ||
        get_long(rd, j, "global_batch", 1, JSON_INT_MAX, &s->global_batch) ||
        get_loss(rd, j, &s->last_loss) ||
        get_u64(rd, j, "data_tokens", INT64_MAX, 1, &s->data_tokens) ||
        get_optimizer(rd, j, &r->optimizer) ||
        get_long(rd, j, "optimizer_step", 0, INT_MAX - 1, &r->optimizer_step) ||
        get_model(rd, j, &r->model) || get_moe_bias(rd, j, r, NULL) ||
        get_tokenizer(rd, j, &s->tokenizer))
        return -1;
    return check_relations(rd, s);
}

int dt_ckpt_state_parse(const char *path, const char *text, dt_ckpt_record *r, char *err,
                        size_t errlen)
{
    reader rd = {path, "", err, errlen};
    memset(r, 0, sizeof *r);
    cJSON *j = cJSON_ParseWithOpts(text, NULL, 1); /* nothing may follow */
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        dt_strf(err, errlen, "%s: not valid JSON, or not an object: the checkpoint state is damaged",
                path);
        return -1;
    }
    int rc = parse_object(&rd, j, r);
    cJSON_Delete(j);
    return rc;
}

int dt_ckpt_state_from_json(const char *path, const cJSON *j, dt_ckpt_record *r, char *err,
                            size_t errlen)
{
    reader rd = {path, "", err, errlen};
    memset(r, 0, sizeof *r);
    if (!cJSON_IsObject(j)) {
        dt_strf(err, errlen, "%s: the checkpoint state is not a JSON object", path);
        return -1;
    }
    return parse_object(&rd, j, r);
}

int dt_ckpt_state_moe_bias(const char *path, const cJSON *j, const dt_ckpt_record *r,
                           float *out, char *err, size_t errlen)
{
    reader rd = {path, "", err, errlen};
    dt_ckpt_record copy = *r;
    return get_moe_bias(&rd, j, &copy, out);
}

int dt_ckpt_state_read(const char *dir, dt_ckpt_record *r, char *err, size_t errlen)
{
    char path[DT_PATH_MAX + 32];
    dt_strf(path, sizeof path, "%s/state.json", dir);
    char *text = dt_read_file(path, DT_CKPT_STATE_BYTES, NULL, err, errlen);
    if (!text) return -1;
    int rc = dt_ckpt_state_parse(path, text, r, err, errlen);
    free(text);
    return rc;
}
