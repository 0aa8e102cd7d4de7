/* Flat buffers <-> safetensors with Hugging Face GPT-2 names. See weights/weights.h. */
#include "train/weights/weights.h"

#include <cjson/cJSON.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/file.h"
#include "core/half.h"
#include "core/parse.h"
#include "core/str.h"
#include "kernels/cast.h"
#include "train/weights/hf_dir.h"

/* ---- inspecting a file ---------------------------------------------------- */

static const dt_st_tensor *find_hf(const dt_st_file *f, const char *prefix, const char *name)
{
    char full[256];
    dt_strf(full, sizeof full, "%s%s", prefix, name);
    const dt_st_tensor *t = dt_st_find(f, full);
    if (t) return t;
    dt_strf(full, sizeof full, "%stransformer.%s", prefix, name);
    return dt_st_find(f, full);
}

/* Hugging Face keeps the sizes that shapes cannot give in config.json. */
static int n_head_from_config_json(const char *weights_path)
{
    char dir[4096], path[4200];
    dt_strf(dir, sizeof dir, "%s", weights_path);
    dt_strf(path, sizeof path, "%s/config.json", dirname(dir));
    char err[256];
    char *buf = dt_read_file(path, 1 << 20, NULL, err, sizeof err);
    if (!buf) return 0; /* no config.json: the caller asks for --n-head */
    cJSON *root = cJSON_Parse(buf);
    free(buf);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(root, "n_head");
    int v = cJSON_IsNumber(h) && h->valuedouble >= 1 && h->valuedouble <= INT_MAX &&
                    h->valuedouble == floor(h->valuedouble)
                ? h->valueint
                : 0;
    cJSON_Delete(root);
    return v;
}

/* A positive integer or number from the file's metadata: 1 found, 0 not
 * there, -1 malformed (err says so). */
static int meta_long(const dt_st_file *f, const char *path, const char *key, long *out,
                     char *err, size_t errlen)
{
    const char *v = dt_st_meta_get(f, key);
    if (!v) return 0;
    if (dt_parse_long(v, 1, INT_MAX, out) == 0) return 1;
    return dt_strf(err, errlen, "%s: its metadata gives %s '%.32s', not a positive integer",
                   path, key, v), -1;
}

static int meta_double(const dt_st_file *f, const char *path, const char *key, double *out,
                       char *err, size_t errlen)
{
    const char *v = dt_st_meta_get(f, key);
    if (!v) return 0;
    if (dt_parse_double(v, 1e-300, 1e300, out) == 0) return 1;
    return dt_strf(err, errlen, "%s: its metadata gives %s '%.32s', not a positive number",
                   path, key, v), -1;
}

/* The Llama family's file: sizes from the shapes; the heads, the context,
 * the rotary base and the norm's epsilon from the metadata dtrain writes
 * (0 when absent: the run's flags decide). */
static int inspect_llama(const dt_st_file *f, const char *path, const dt_st_tensor *emb,
                         dt_gpt_config *cfg, char *err, size_t errlen)
{
    char name[96];
    cfg->arch = DT_ARCH_LLAMA;
    cfg->vocab_size = (int)emb->shape[0];
    cfg->n_embd = (int)emb->shape[1];
    for (;;) {
        dt_strf(name, sizeof name, "model.layers.%d.input_layernorm.weight", cfg->n_layer);
        if (!dt_st_find(f, name)) break;
        cfg->n_layer++;
    }
    const dt_st_tensor *gate = dt_st_find(f, "model.layers.0.mlp.gate_proj.weight");
    if (gate && gate->ndim == 2) cfg->ffn = (int)gate->shape[0];
    cfg->tie = !dt_st_find(f, "lm_head.weight");
    /* Mixtral's experts: E from the router [E, C], F from an expert's w1 [F, C]. */
    const dt_st_tensor *router = dt_st_find(f, "model.layers.0.block_sparse_moe.gate.weight");
    const dt_st_tensor *w1 = dt_st_find(f, "model.layers.0.block_sparse_moe.experts.0.w1.weight");
    if (router && router->ndim == 2) cfg->moe.experts = (int)router->shape[0];
    if (router && w1 && w1->ndim == 2) cfg->moe.ffn = (int)w1->shape[0];
    long heads = 0, kv = 0, ctx = 0, topk = 0;
    if (meta_long(f, path, "n_head", &heads, err, errlen) < 0 ||
        meta_long(f, path, "n_kv_head", &kv, err, errlen) < 0 ||
        meta_long(f, path, "block_size", &ctx, err, errlen) < 0 ||
        (router && meta_long(f, path, "moe_router_topk", &topk, err, errlen) < 0) ||
        meta_double(f, path, "rope_theta", &cfg->rope_theta, err, errlen) < 0 ||
        meta_double(f, path, "norm_eps", &cfg->norm_eps, err, errlen) < 0)
        return -1;
    cfg->n_head = (int)heads, cfg->n_kv_head = (int)kv, cfg->block_size = (int)ctx;
    cfg->moe.topk = (int)topk;
    if (!kv && heads) cfg->n_kv_head = dt_weights_kv_heads(path, cfg->n_head, cfg->n_embd);
    return 0;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int dt_weights_open(const char *path, dt_st_file *f, char *err, size_t errlen)
{
    return is_dir(path) ? dt_hf_open(path, f, err, errlen) : dt_st_open(path, f, err, errlen);
}

int dt_weights_kv_heads(const char *path, int n_head, int n_embd)
{
    dt_st_file f;
    char err[256];
    if (n_head <= 0 || n_embd % n_head || dt_weights_open(path, &f, err, sizeof err)) return 0;
    const dt_st_tensor *k = dt_st_find(&f, "model.layers.0.self_attn.k_proj.weight");
    const int D = n_embd / n_head;
    const int kv = k && k->ndim == 2 && k->shape[0] % D == 0 ? (int)(k->shape[0] / D) : 0;
    dt_st_close(&f);
    return kv;
}

/* GPT-2's sizes from f's shapes and metadata (path names f in messages). */
static int inspect_gpt2(const dt_st_file *f, const char *path, dt_gpt_config *cfg, char *err,
                        size_t errlen)
{
    const dt_st_tensor *wte = find_hf(f, "", "wte.weight");
    const dt_st_tensor *wpe = find_hf(f, "", "wpe.weight");
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2)
        return dt_strf(err, errlen, "%s: no 2-D wte.weight and wpe.weight (GPT-2's) nor "
                       "model.embed_tokens.weight (the Llama family's): not a model's weights "
                       "file", path), -1;
    cfg->vocab_size = (int)wte->shape[0];
    cfg->n_embd = (int)wte->shape[1];
    cfg->block_size = (int)wpe->shape[0];
    char name[64];
    for (;;) {
        dt_strf(name, sizeof name, "h.%d.ln_1.weight", cfg->n_layer);
        if (!find_hf(f, "", name)) break;
        cfg->n_layer++;
    }
    const char *nh = dt_st_meta_get(f, "n_head");
    long heads = 0;
    if (nh && dt_parse_long(nh, 1, INT_MAX, &heads) != 0)
        return dt_strf(err, errlen, "%s: its metadata gives n_head '%.32s', not a positive "
                       "integer", path, nh), -1;
    cfg->n_head = nh ? (int)heads : n_head_from_config_json(f->path);
    /* Experts: E from the first layer's router [E, C], F from an expert's c_fc [C, F]. */
    const dt_st_tensor *router = find_hf(f, "", "h.0.mlp.router.weight");
    const dt_st_tensor *fc = find_hf(f, "", "h.0.mlp.experts.0.c_fc.weight");
    if (router && router->ndim == 2) cfg->moe.experts = (int)router->shape[0];
    if (router && fc && fc->ndim == 2) cfg->moe.ffn = (int)fc->shape[1];
    const char *k = router ? dt_st_meta_get(f, "moe_router_topk") : NULL;
    long topk = 0;
    if (k && dt_parse_long(k, 1, cfg->moe.experts, &topk) != 0)
        return dt_strf(err, errlen, "%s: its metadata gives moe_router_topk '%.32s', not an "
                       "integer in [1, %d] (its experts)", path, k, cfg->moe.experts), -1;
    cfg->moe.topk = (int)topk; /* 0: not recorded */
    return 0;
}

int dt_weights_inspect(const char *path, dt_gpt_config *cfg, char *err, size_t errlen)
{
    dt_st_file f;
    if (dt_weights_open(path, &f, err, errlen) != 0) return -1;
    memset(cfg, 0, sizeof *cfg);
    const dt_st_tensor *emb = dt_st_find(&f, "model.embed_tokens.weight");
    int rc = emb && emb->ndim == 2 ? inspect_llama(&f, path, emb, cfg, err, errlen)
                                   : inspect_gpt2(&f, path, cfg, err, errlen);
    /* A model directory: its config.json gives what the shapes do not. */
    if (rc == 0 && is_dir(path))
        rc = dt_hf_config_read(path, &f, cfg, err, errlen);
    dt_st_close(&f);
    return rc;
}

/* ---- checking values ------------------------------------------------------ */

int dt_weights_all_finite(const float *x, size_t n, int nonneg)
{
    uint32_t any = 0;
    const uint32_t neg = nonneg ? 1u : 0u;
#pragma omp simd reduction(| : any)
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, sizeof b);
        any |= (uint32_t)((b & 0x7f800000u) == 0x7f800000u) |
               (neg & (b >> 31) & (uint32_t)((b & 0x7fffffffu) != 0));
    }
    return !any;
}

static int all_finite(const float *x, size_t n) { return dt_weights_all_finite(x, n, 0); }

int dt_weights_find(const dt_gpt *m, const float *flat, int (*bad)(float), int *tensor,
                    size_t *elem)
{
    for (int i = 0; i < m->n_tensors; i++) {
        const dt_param_tensor *p = &m->tensors[i];
        for (size_t k = 0; k < p->numel; k++) {
            if (bad(flat[p->offset + k])) {
                *tensor = i;
                *elem = k;
                return 1;
            }
        }
    }
    return 0;
}

/* "tensor PREFIXNAME holds nan at element K" */
static void describe(const dt_param_tensor *p, const char *prefix, float v, size_t k, char *err,
                     size_t errlen)
{
    char value[32];
    if (isnan(v))
        dt_strf(value, sizeof value, "nan");
    else
        dt_strf(value, sizeof value, "%g", (double)v);
    dt_strf(err, errlen, "tensor %s%s holds %s at element %zu", prefix, p->name, value, k);
}

int dt_weights_check_finite_range(const dt_gpt *m, const float *x, size_t lo, size_t hi,
                                  const char *prefix, char *err, size_t errlen)
{
    if (all_finite(x, hi - lo)) return 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const dt_param_tensor *p = &m->tensors[i];
        size_t a = p->offset > lo ? p->offset : lo, end = p->offset + p->numel;
        size_t b = end < hi ? end : hi;
        for (size_t k = a; k < b; k++)
            if (!isfinite(x[k - lo])) {
                describe(p, prefix, x[k - lo], k - p->offset, err, errlen);
                return -1;
            }
    }
    /* Padding between tensors (ZeRO's segments): no tensor to name. */
    size_t k = 0;
    while (isfinite(x[k])) k++;
    dt_strf(err, errlen, "float %zu of the flat layout (padding) holds %g", lo + k, (double)x[k]);
    return -1;
}

int dt_weights_check_finite(const dt_gpt *m, const float *flat, const char *prefix, char *err,
                            size_t errlen)
{
    for (int i = 0; i < m->n_tensors; i++) {
        const dt_param_tensor *p = &m->tensors[i];
        if (dt_weights_check_finite_range(m, flat + p->offset, p->offset, p->offset + p->numel,
                                          prefix, err, errlen))
            return -1;
    }
    return 0;
}

/* ---- reading ------------------------------------------------------------- */

static int check_shape(const dt_param_tensor *p, const dt_st_tensor *t, const char *path,
                       char *err, size_t errlen)
{
    int ok = t->ndim == p->ndim;
    for (int d = 0; ok && d < p->ndim; d++) ok = t->shape[d] == p->shape[d];
    if (ok) return 0;
    char want[64], got[128] = "";
    if (p->ndim == 2)
        dt_strf(want, sizeof want, "[%d, %d]", p->shape[0], p->shape[1]);
    else
        dt_strf(want, sizeof want, "[%d]", p->shape[0]);
    size_t used = 0;
    for (int d = 0; d < t->ndim && used + 24 < sizeof got; d++)
        used += (size_t)snprintf(got + used, sizeof got - used, "%s%lld", d ? ", " : "",
                                 (long long)t->shape[d]);
    dt_strf(err, errlen, "%s: tensor %s has shape [%s], the model needs %s", path, t->name, got,
            want);
    return -1;
}

const dt_st_tensor *dt_weights_tensor(const dt_gpt *m, const dt_st_file *f, const char *prefix,
                                      int k, char *err, size_t errlen)
{
    const dt_param_tensor *p = &m->tensors[k];
    const dt_st_tensor *t = find_hf(f, prefix, p->name);
    if (!t) {
        dt_strf(err, errlen, "%s: tensor %s%s is missing", f->path, prefix, p->name);
        return NULL;
    }
    return check_shape(p, t, f->path, err, errlen) == 0 ? t : NULL;
}

int dt_weights_read(const dt_gpt *m, float *flat, const dt_st_file *f, const char *prefix,
                    char *err, size_t errlen)
{
    for (int i = 0; i < m->n_tensors; i++) {
        const dt_param_tensor *p = &m->tensors[i];
        const dt_st_tensor *t = dt_weights_tensor(m, f, prefix, i, err, errlen);
        if (!t || dt_st_read_f32(f, t, flat + p->offset, err, errlen) != 0) return -1;
    }
    char why[256];
    if (dt_weights_check_finite(m, flat, prefix, why, sizeof why) == 0) return 0;
    dt_strf(err, errlen, "%s: %s", f->path, why);
    return -1;
}

int dt_weights_load(dt_gpt *m, const char *path, char *err, size_t errlen)
{
    dt_st_file f;
    if (dt_weights_open(path, &f, err, errlen) != 0) return -1;
    int rc = dt_weights_read(m, m->params, &f, "", err, errlen);
    dt_st_close(&f);
    return rc;
}

/* Tensor k's elements inside range q of the flat layout, read into
 * base + (position - q->lo) and checked finite; the file's pages of them
 * are let go at once, so the mapping never holds more than one span. */
static int read_span(const dt_gpt *m, const dt_st_file *f, const dt_st_tensor *t, int k,
                     const dt_flat_range *q, float *base, char *err, size_t errlen)
{
    const dt_param_tensor *p = &m->tensors[k];
    size_t a = q->lo > p->offset ? q->lo : p->offset, b = p->offset + p->numel;
    if (q->hi < b) b = q->hi;
    if (a >= b) return 0;
    float *dst = base + (a - q->lo);
    if (dt_st_read_f32_range(f, t, a - p->offset, b - a, dst, err, errlen)) return -1;
    dt_st_let_go(t, a - p->offset, b - a);
    if (all_finite(dst, b - a)) return 0;
    size_t i = 0;
    while (isfinite(dst[i])) i++;
    char why[200];
    describe(p, "", dst[i], a + i - p->offset, why, sizeof why);
    return dt_strf(err, errlen, "%s: %s", f->path, why), -1;
}

int dt_weights_load_ranges(dt_gpt *m, const char *path, const dt_flat_ranges *keep, float *dst,
                           int packed, char *err, size_t errlen)
{
    dt_st_file f;
    if (dt_weights_open(path, &f, err, errlen) != 0) return -1;
    int rc = 0;
    for (int k = 0; rc == 0 && k < m->n_tensors; k++) {
        const dt_st_tensor *t = dt_weights_tensor(m, &f, "", k, err, errlen);
        rc = t ? 0 : -1;
        for (int i = 0; rc == 0 && i < keep->n; i++) {
            const dt_flat_range *q = &keep->r[i];
            rc = read_span(m, &f, t, k, q, dst + (packed ? q->at : q->lo), err, errlen);
        }
    }
    dt_st_close(&f);
    return rc;
}

/* ---- writing ------------------------------------------------------------- */

/* x in the fewest digits that read back as x ("1e-05", not 17 digits). */
static void shortest(char *buf, size_t n, double x)
{
    for (int p = 1; p <= 17; p++) {
        dt_strf(buf, n, "%.*g", p, x);
        if (strtod(buf, NULL) == x) return;
    }
}

/* What the shapes do not say, beside the sizes: the heads, the context,
 * the routing's K, the family's options. Returns the count. */
static int write_meta(const dt_gpt_config *c, dt_st_meta *meta, char (*v)[32])
{
    int n = 0;
#define META_INT(key, x) (dt_strf(v[n], 32, "%d", (x)), meta[n] = (dt_st_meta){key, v[n]}, n++)
#define META_NUM(key, x) (shortest(v[n], 32, (x)), meta[n] = (dt_st_meta){key, v[n]}, n++)
    META_INT("n_layer", c->n_layer);
    META_INT("n_head", c->n_head);
    META_INT("n_embd", c->n_embd);
    META_INT("vocab_size", c->vocab_size);
    META_INT("block_size", c->block_size);
    if (c->moe.experts) META_INT("moe_router_topk", c->moe.topk);
    if (c->arch == DT_ARCH_LLAMA) {
        meta[n++] = (dt_st_meta){"arch", "llama"};
        META_INT("n_kv_head", dt_gpt_kv_heads(c));
        META_NUM("rope_theta", dt_gpt_rope_theta(c));
        META_NUM("norm_eps", dt_gpt_norm_eps(c));
    }
#undef META_INT
#undef META_NUM
    return n;
}

/* Floats [lo, hi) of flat (tensors [k0, k1)) as 16-bit dtype values,
 * rounded to nearest even, in a new buffer; NULL with a message when out
 * of memory or when a finite value becomes F16's infinity. */
static uint16_t *narrowed(const dt_gpt *m, const float *flat, int k0, int k1, dt_st_dtype dtype,
                          const char *path, char *err, size_t errlen)
{
    const size_t lo = m->tensors[k0].offset;
    const size_t hi = m->tensors[k1 - 1].offset + m->tensors[k1 - 1].numel;
    uint16_t *h = malloc((hi - lo) * sizeof *h);
    if (!h) return dt_strf(err, errlen, "%s: out of memory for the %s copy", path,
                           dt_weights_torch_dtype(dtype)), NULL;
    if (dtype == DT_ST_BF16) dt_cast_f32_to_bf16(h, flat + lo, hi - lo);
    else dt_cast_f32_to_f16(h, flat + lo, hi - lo);
    for (int k = k0; dtype == DT_ST_F16 && k < k1; k++) {
        const dt_param_tensor *t = &m->tensors[k];
        for (size_t i = 0; i < t->numel; i++) {
            if (!isinf(dt_f16_to_f32(h[t->offset - lo + i]))) continue;
            dt_strf(err, errlen, "%s: %s[%zu] = %g is past float16's range (65504): save it "
                    "with --save-dtype bf16 or fp32", path, t->name, i, flat[t->offset + i]);
            free(h);
            return NULL;
        }
    }
    return h;
}

/* Tensors [k0, k1) of each buffer into one file, buffer b's named
 * prefixes[b] + HF name, stored as dtype (16-bit types: one buffer). */
static int write_tensors(const dt_gpt *m, const float *const *bufs, const char *const *prefixes,
                         int nbufs, int k0, int k1, dt_st_dtype dtype, const char *path,
                         char *err, size_t errlen)
{
    char why[256];
    const size_t lo = m->tensors[k0].offset;
    const size_t hi = m->tensors[k1 - 1].offset + m->tensors[k1 - 1].numel;
    for (int b = 0; b < nbufs; b++) {
        if (dt_weights_check_finite_range(m, bufs[b] + lo, lo, hi, prefixes[b], why,
                                          sizeof why) != 0) {
            dt_strf(err, errlen, "%s: refusing to write non-finite values: %s", path, why);
            return -1;
        }
    }
    const int per = k1 - k0, n = per * nbufs;
    uint16_t *half = NULL;
    if (dtype != DT_ST_F32 && !(half = narrowed(m, bufs[0], k0, k1, dtype, path, err, errlen)))
        return -1;
    dt_st_entry *e = calloc((size_t)n, sizeof *e);
    char (*names)[96] = calloc((size_t)n, sizeof *names);
    if (!e || !names) {
        free(e);
        free(names);
        free(half);
        dt_strf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    for (int b = 0; b < nbufs; b++) {
        for (int i = 0; i < per; i++) {
            const dt_param_tensor *p = &m->tensors[k0 + i];
            dt_st_entry *x = &e[b * per + i];
            char *name = names[b * per + i];
            dt_strf(name, sizeof names[0], "%s%s", prefixes[b], p->name);
            x->name = name;
            x->data = half ? (const void *)(half + (p->offset - lo)) : bufs[b] + p->offset;
            x->ndim = p->ndim;
            x->shape[0] = p->shape[0];
            x->shape[1] = p->shape[1];
            x->dtype = half ? dtype : DT_ST_F32;
        }
    }
    dt_st_meta meta[10];
    char v[10][32];
    const int nm = write_meta(&m->cfg, meta, v);
    int rc = dt_st_write(path, e, n, meta, nm, err, errlen);
    free(e);
    free(names);
    free(half);
    return rc;
}

int dt_weights_write(const dt_gpt *m, const float *const *bufs, const char *const *prefixes,
                     int nbufs, const char *path, char *err, size_t errlen)
{
    return write_tensors(m, bufs, prefixes, nbufs, 0, m->n_tensors, DT_ST_F32, path, err,
                         errlen);
}

int dt_weights_write_part(const dt_gpt *m, const float *flat, const char *prefix, int k0, int k1,
                          dt_st_dtype dtype, const char *path, char *err, size_t errlen)
{
    return write_tensors(m, &flat, &prefix, 1, k0, k1, dtype, path, err, errlen);
}

int dt_weights_save_as(const dt_gpt *m, const char *path, dt_st_dtype dtype, char *err,
                       size_t errlen)
{
    if (dt_hf_is_dir_path(path)) return dt_hf_save(m, m->params, path, dtype, err, errlen);
    return dt_weights_write_part(m, m->params, "", 0, m->n_tensors, dtype, path, err, errlen);
}

int dt_weights_save(const dt_gpt *m, const char *path, char *err, size_t errlen)
{
    return dt_weights_save_as(m, path, DT_ST_F32, err, errlen);
}

static const struct {
    const char *name, *torch;
    dt_st_dtype dtype;
} dtypes[] = {{"fp32", "float32", DT_ST_F32}, {"bf16", "bfloat16", DT_ST_BF16},
              {"fp16", "float16", DT_ST_F16}};

int dt_weights_dtype_parse(const char *name, dt_st_dtype *out)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(name, dtypes[i].name) || !strcmp(name, dtypes[i].torch))
            return *out = dtypes[i].dtype, 0;
    return -1;
}

const char *dt_weights_torch_dtype(dt_st_dtype dtype)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dtype == dtype) return dtypes[i].torch;
    return "float32";
}

int dt_weights_check_output(const char *what, const char *path, char *err, size_t errlen)
{
    if (dt_hf_is_dir_path(path)) return dt_hf_check_output(what, path, err, errlen);
    if (!is_dir(path)) return dt_check_output_file(what, path, err, errlen);
    return dt_strf(err, errlen, "%s %s: is a directory; give a file name, or %s/ for a Hugging "
                   "Face model directory", what, path, path), -1;
}
