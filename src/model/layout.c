/* The model's flat layout: the configuration's checks and counts, the
 * table of tensors (the embeddings, each layer's blocks' tensors in block
 * order, the final norm's), its segments, and the cuts of tensor and
 * context parallelism that change it. See gpt.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "kernels/crossentropy_split.h"
#include "model/model_internal.h"

/* What the Llama family's options need (GPT-2 takes none of them). */
static int family_check(const dt_gpt_config *cfg, char *err, size_t errlen)
{
    const int NH = cfg->n_head, KV = dt_gpt_kv_heads(cfg), D = cfg->n_embd / cfg->n_head;
    char ok[128];
    if (cfg->arch < 0 || cfg->arch >= DT_ARCH_COUNT)
        return dt_strf(err, errlen, "model: unknown family %d (%s)", cfg->arch,
                       dt_arch_names()), -1;
    if (cfg->arch != DT_ARCH_LLAMA) {
        if (cfg->n_kv_head || cfg->ffn || cfg->rope_theta || cfg->norm_eps || cfg->tie)
            return dt_strf(err, errlen, "model: key/value heads, --ffn-hidden-size, "
                           "--rope-theta, --norm-eps and tied embeddings are the Llama "
                           "family's options (--arch llama); GPT-2's are fixed"), -1;
        return 0;
    }
    if (KV < 1 || KV > NH || NH % KV) {
        dt_str_divisors(ok, sizeof ok, NH);
        return dt_strf(err, errlen, "model: %d key/value heads do not divide %d heads into "
                       "equal groups; --n-kv-head %s would", KV, NH, ok), -1;
    }
    if (D % 2)
        return dt_strf(err, errlen, "model: rotary embeddings turn pairs of a head's "
                       "dimensions, and n_embd %d / n_head %d = %d is odd", cfg->n_embd, NH,
                       D), -1;
    if (cfg->ffn < 0 || cfg->rope_theta < 0 || cfg->norm_eps < 0)
        return dt_strf(err, errlen, "model: --ffn-hidden-size %d, --rope-theta %g and "
                       "--norm-eps %g must be positive", cfg->ffn, cfg->rope_theta,
                       cfg->norm_eps), -1;
    return 0;
}

int dt_gpt_config_check(const dt_gpt_config *cfg, char *err, size_t errlen)
{
    const struct { const char *name; int v; } dims[] = {
        {"n_layer", cfg->n_layer},       {"n_head", cfg->n_head},
        {"n_embd", cfg->n_embd},         {"vocab_size", cfg->vocab_size},
        {"block_size", cfg->block_size},
    };
    dt_block blocks[DT_LAYER_MAX_BLOCKS];
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i].v <= 0) {
            dt_strf(err, errlen, "model: %s must be positive (got %d)", dims[i].name, dims[i].v);
            return -1;
        }
    }
    if (cfg->n_embd % cfg->n_head != 0) {
        dt_strf(err, errlen, "model: n_embd (%d) must be divisible by n_head (%d)", cfg->n_embd,
                cfg->n_head);
        return -1;
    }
    if (family_check(cfg, err, errlen)) return -1;
    /* Row offsets are ints in the kernels: keep every activation indexable. */
    if ((double)cfg->n_embd * 4 * cfg->block_size > 2e9 ||
        (double)cfg->vocab_size * cfg->n_embd > 2e11) {
        dt_strf(err, errlen, "model: n_embd %d with block_size %d / vocab_size %d is too large",
                cfg->n_embd, cfg->block_size, cfg->vocab_size);
        return -1;
    }
    const int n = dt_blocks_parse(dt_gpt_blocks(cfg), blocks, err, errlen);
    return n < 0 ? -1 : dt_moe_config_check(cfg, blocks, n, err, errlen);
}

/* The whole tensors' floats of one layer (blocks parsed from cfg). */
static size_t layer_params(const dt_gpt_config *cfg, const dt_block *b, int n)
{
    dt_tensor_spec spec[DT_BLOCK_MAX_TENSORS];
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const int k = b[i].kind->tensors(cfg, NULL, NULL, spec);
        for (int j = 0; j < k; j++)
            total += (size_t)spec[j].d0 * (size_t)(spec[j].d1 ? spec[j].d1 : 1);
    }
    return total;
}

/* A layer's blocks parsed (a configuration that failed its check has
 * none: 0). */
static int layer_blocks(const dt_gpt_config *cfg, dt_block *b)
{
    char err[160];
    const int n = dt_blocks_parse(dt_gpt_blocks(cfg), b, err, sizeof err);
    return n < 0 ? 0 : n;
}

size_t dt_gpt_layer_param_count(const dt_gpt_config *cfg)
{
    dt_block b[DT_LAYER_MAX_BLOCKS];
    return layer_params(cfg, b, layer_blocks(cfg, b));
}

size_t dt_gpt_final_norm_param_count(const dt_gpt_config *cfg)
{
    dt_block b[DT_LAYER_MAX_BLOCKS];
    return layer_blocks(cfg, b) ? layer_params(cfg, b, 1) : 0; /* of the first norm's kind */
}

size_t dt_gpt_param_count(const dt_gpt_config *cfg)
{
    size_t V = (size_t)cfg->vocab_size, T = (size_t)cfg->block_size, C = (size_t)cfg->n_embd;
    const size_t positions = dt_arch_of(cfg)->positions ? T * C : 0;
    const size_t head = dt_gpt_tied(cfg) ? 0 : V * C;
    return V * C + positions + (size_t)cfg->n_layer * dt_gpt_layer_param_count(cfg) +
           dt_gpt_final_norm_param_count(cfg) + head;
}

double dt_gpt_layer_flops_per_token(const dt_gpt_config *cfg, int T)
{
    dt_block b[DT_LAYER_MAX_BLOCKS];
    const int n = layer_blocks(cfg, b);
    double layer = 0;
    for (int i = 0; i < n; i++) layer += b[i].kind->flops(cfg, T);
    return layer;
}

/* The formula and why: gpt.h. */
double dt_gpt_flops_per_token(const dt_gpt_config *cfg, int T)
{
    return 6.0 * (double)cfg->vocab_size * cfg->n_embd +
           cfg->n_layer * dt_gpt_layer_flops_per_token(cfg, T);
}

/* ---- the tensor table --------------------------------------------------- */

static dt_slice whole_tensor(int d0, int d1)
{
    return d1 > 0 ? (dt_slice){0, d0, 1, 0, 0, d1} : (dt_slice){0, 1, 1, 0, 0, d0};
}

static void add_tensor(dt_gpt *m, size_t *cursor, const char *name, const dt_tensor_spec *sp)
{
    dt_param_tensor *t = &m->tensors[m->n_tensors++];
    const int d0 = sp->d0, d1 = sp->d1;
    dt_slice w = whole_tensor(d0, d1), s = sp->slice.rows ? sp->slice : w;
    dt_strf(t->name, sizeof t->name, "%s", name);
    t->offset = *cursor;
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d1 > 0 ? s.rows : s.cols;
    t->shape[1] = d1 > 0 ? s.cols : 0;
    t->gshape[0] = d0;
    t->gshape[1] = d1 > 0 ? d1 : 0;
    t->row0 = s.row0, t->nblk = s.nblk, t->col0 = s.col0, t->cstride = s.cstride;
    t->split = s.rows != w.rows || s.cols != w.cols;
    t->expert = sp->apart || sp->absent;
    if (sp->absent) { /* another rank's: no floats here, but its place in the table */
        t->shape[0] = t->shape[1] = 0;
        t->row0 = t->col0 = t->cstride = 0, t->nblk = 1;
        t->split = 0;
        s.rows = s.cols = 0;
    }
    t->numel = (size_t)s.rows * (size_t)s.cols;
    t->decay = t->ndim >= 2;
    t->init = sp->init;
    m->n_params += t->numel;
    *cursor += (t->numel + DT_TENSOR_ALIGN_FLOATS - 1) / DT_TENSOR_ALIGN_FLOATS *
               DT_TENSOR_ALIGN_FLOATS;
}

/* A block's tensors, named prefix + its name + the kind's. */
static int add_block(dt_gpt *m, size_t *cursor, const char *prefix, const dt_block *b)
{
    dt_tensor_spec spec[DT_BLOCK_MAX_TENSORS];
    char name[DT_TENSOR_NAME_MAX];
    const int k = b->kind->tensors(&m->cfg, &m->tp, &m->ep, spec);
    for (int j = 0; j < k; j++) {
        dt_strf(name, sizeof name, "%s%s.%s", prefix, b->name, spec[j].name);
        add_tensor(m, cursor, name, &spec[j]);
    }
    return k;
}

/* Segment 0: the tokens' table (this rank's vocabulary rows) and the
 * learned positions; each layer; then the final norm and the untied head
 * (its vocabulary rows, as the table's). Names are the family's. */
static void build_layout(dt_gpt *m)
{
    const dt_arch *arch = dt_arch_of(&m->cfg);
    const int C = m->cfg.n_embd;
    const size_t a = m->seg_align;
    size_t cursor = 0;
    char prefix[DT_TENSOR_NAME_MAX];
    const dt_tensor_spec vocab = {"", m->cfg.vocab_size, C, {m->tp.v0, m->tp.vocab, 1, 0, 0, C},
                                  DT_INIT_NORMAL, 0, 0};
    const dt_tensor_spec wpe = {"", m->cfg.block_size, C, {0}, DT_INIT_NORMAL, 0, 0};
#define END_SEGMENT() (cursor = (cursor + a - 1) / a * a)
    m->n_tensors = 0;
    m->n_params = 0;
    add_tensor(m, &cursor, arch->tokens, &vocab);
    if (arch->positions) add_tensor(m, &cursor, arch->positions, &wpe);
    m->embed_tensors = m->n_tensors;
    END_SEGMENT();
    for (int l = 0; l < m->cfg.n_layer; l++) {
        dt_strf(prefix, sizeof prefix, arch->layer, l);
        for (int i = 0; i < m->n_blocks; i++) add_block(m, &cursor, prefix, &m->blocks[i]);
        END_SEGMENT();
    }
    m->final_norm.tensor0 = m->n_tensors;
    m->final_norm.n_tensors = add_block(m, &cursor, "", &m->final_norm);
    m->head_tensor = 0;
    if (!dt_gpt_tied(&m->cfg)) {
        m->head_tensor = m->n_tensors;
        add_tensor(m, &cursor, arch->head, &vocab);
    }
    END_SEGMENT();
#undef END_SEGMENT
    m->n_floats = cursor;
}

/* The layer's blocks from the configuration: where each one's tensors
 * and buffers sit among the layer's; the final norm of the first norm's
 * kind. The count of buffers comes from the kinds' lists. */
static int plan_blocks(dt_gpt *m, char *err, size_t errlen)
{
    dt_tensor_spec spec[DT_BLOCK_MAX_TENSORS];
    dt_act_spec acts[DT_BLOCK_MAX_ACTS];
    int n = dt_blocks_parse(dt_gpt_blocks(&m->cfg), m->blocks, err, errlen), tensors = 0;
    if (n < 0) return -1;
    m->n_blocks = n;
    m->acts.per_layer = 0;
    for (int i = 0; i < n; i++) {
        dt_block *b = &m->blocks[i];
        b->tensor0 = tensors;
        b->n_tensors = b->kind->tensors(&m->cfg, NULL, NULL, spec);
        tensors += b->n_tensors;
        b->act0 = m->acts.per_layer;
        b->n_acts = b->kind->acts(m, 0, 0, acts);
        m->acts.per_layer += b->n_acts;
    }
    m->layer_tensors = tensors;
    m->final_norm = (dt_block){.kind = m->blocks[0].kind};
    dt_strf(m->final_norm.name, sizeof m->final_norm.name, "%s", dt_arch_of(&m->cfg)->final_norm);
    m->final_norm.n_acts = m->final_norm.kind->acts(m, 0, 0, acts);
    return 0;
}

int dt_gpt_pad_segments(dt_gpt *m, size_t align)
{
    if (m->params || m->grads || align == 0 || align % DT_TENSOR_ALIGN_FLOATS != 0) {
        dt_strf(m->error, sizeof m->error,
                "model: segments can be padded only to a multiple of %d floats, before any "
                "buffer exists (asked %zu)", DT_TENSOR_ALIGN_FLOATS, align);
        return -1;
    }
    m->seg_align = align;
    build_layout(m);
    return 0;
}

int dt_gpt_set_tp(dt_gpt *m, int rank, int size)
{
    const int NH = m->cfg.n_head, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    const int KV = dt_gpt_kv_heads(&m->cfg), FF = dt_gpt_ffn(&m->cfg);
    char ok[128];
    if (m->params || m->grads || size < 1 || rank < 0 || rank >= size)
        return dt_strf(m->error, sizeof m->error, "model: tensor parallelism is set on a "
                       "layout without buffers, rank 0 <= %d < size %d", rank, size), -1;
    if (NH % size || FF % size) {
        dt_str_divisors(ok, sizeof ok, NH);
        return dt_strf(m->error, sizeof m->error, "--tp %d: the model's %d heads (n_embd %d, "
                       "MLP width %d) do not split into %d equal parts; --tp %s would work",
                       size, NH, C, FF, size, ok), -1;
    }
    /* Each rank holds whole groups: its query heads with the key/value
     * heads they read (Megatron's rule when the kv heads divide by tp). */
    if (KV % size) {
        dt_str_divisors(ok, sizeof ok, KV);
        return dt_strf(m->error, sizeof m->error, "--tp %d: the model's %d key/value heads do "
                       "not split into %d equal parts (each rank holds whole groups of "
                       "query heads with their key/value head); --tp %s would work", size, KV,
                       size, ok), -1;
    }
    const int F = m->cfg.moe.ffn ? m->cfg.moe.ffn : 4 * C;
    if (m->cfg.moe.experts && F % size) {
        dt_str_divisors(ok, sizeof ok, F);
        return dt_strf(m->error, sizeof m->error, "--tp %d: the experts' hidden width %d does "
                       "not split into %d equal parts; --tp %s would work", size, F, size, ok),
               -1;
    }
    int v0, vl, last0, last;
    dt_vocab_slice(V, size, rank, &v0, &vl);
    dt_vocab_slice(V, size, size - 1, &last0, &last);
    if (last <= 0)
        return dt_strf(m->error, sizeof m->error, "--tp %d: a vocabulary of %d in slices of "
                       "%d rows leaves rank %d none; use a vocabulary above %d, or fewer "
                       "ranks", size, V, (V + size - 1) / size, size - 1,
                       (V + size - 1) / size * (size - 1)), -1;
    m->tp = (dt_gpt_tp){.rank = rank, .size = size, .sp = m->tp.sp && size > 1,
                        .heads = NH / size, .attn = C / size, .kv_heads = KV / size,
                        .mlp = FF / size, .v0 = v0,
                        .vocab = vl, .reduce = m->tp.reduce, .ctx = m->tp.ctx};
    build_layout(m);
    return 0;
}

int dt_gpt_set_ep(dt_gpt *m, int rank, int size)
{
    const int E = m->cfg.moe.experts;
    char ok[128];
    if (m->params || m->grads || size < 1 || rank < 0 || rank >= size)
        return dt_strf(m->error, sizeof m->error, "model: expert parallelism is set on a "
                       "layout without buffers, rank 0 <= %d < size %d", rank, size), -1;
    if (size > 1 && E == 0)
        return dt_strf(m->error, sizeof m->error, "--expert-model-parallel-size %d splits a "
                       "mixture of experts' experts: add --num-experts E", size), -1;
    if (size > 1 && E % size) {
        dt_str_divisors(ok, sizeof ok, E);
        return dt_strf(m->error, sizeof m->error, "--expert-model-parallel-size %d: the %d "
                       "experts do not split into %d equal parts; --expert-model-parallel-size "
                       "%s would work", size, E, size, ok), -1;
    }
    m->ep.rank = rank, m->ep.size = size;
    m->ep.experts = size > 1 ? E / size : E;
    m->ep.e0 = rank * m->ep.experts;
    build_layout(m);
    return 0;
}

int dt_gpt_set_cp(dt_gpt *m, int rank, int size, dt_shard_kind kind, int saved_widths)
{
    if (m->acts.mem || size < 1 || rank < 0 || rank >= size || saved_widths < 0)
        return dt_strf(m->error, sizeof m->error, "model: context parallelism is set on a "
                       "model without activations, rank 0 <= %d < size %d", rank, size), -1;
    m->cp.rank = rank;
    m->cp.size = size;
    m->cp.kind = kind;
    m->cp.saved_widths = saved_widths;
    return 0;
}

int dt_gpt_rows(const dt_gpt *m, int t) { return t / m->cp.size; }

int dt_gpt_create_layout(dt_gpt *m, const dt_gpt_config *cfg, dt_precision prec, char *err,
                         size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (dt_gpt_config_check(cfg, err, errlen) != 0) return -1;
    m->cfg = *cfg;
    m->prec = prec;
    m->seg_align = DT_TENSOR_ALIGN_FLOATS;
    m->tp = (dt_gpt_tp){.rank = 0, .size = 1, .heads = cfg->n_head, .attn = cfg->n_embd,
                        .kv_heads = dt_gpt_kv_heads(cfg), .mlp = dt_gpt_ffn(cfg), .v0 = 0,
                        .vocab = cfg->vocab_size};
    m->cp = (dt_gpt_cp){.rank = 0, .size = 1, .kind = DT_SHARD_CONTIGUOUS};
    m->ep = (dt_gpt_ep){.rank = 0, .size = 1, .e0 = 0, .experts = cfg->moe.experts};
    if (plan_blocks(m, err, errlen)) return -1;
    const size_t n = 3 + (size_t)m->layer_tensors * (size_t)cfg->n_layer + DT_BLOCK_MAX_TENSORS;
    if (!(m->tensors = calloc(n, sizeof *m->tensors))) {
        dt_strf(err, errlen, "model: out of memory for the tensor table");
        return -1;
    }
    build_layout(m);
    if (dt_model_moe_alloc(m)) return dt_strf(err, errlen, "%s", m->error), -1;
    return 0;
}

const dt_param_tensor *dt_gpt_find(const dt_gpt *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

int dt_gpt_segments(const dt_gpt *m) { return m->cfg.n_layer + 2; }

int dt_model_layer_tensor0(const dt_gpt *m, int l)
{
    return m->embed_tensors + m->layer_tensors * l;
}

size_t dt_gpt_segment_start(const dt_gpt *m, int segment)
{
    if (segment <= 0) return 0;
    if (segment >= m->cfg.n_layer + 2) return m->n_floats;
    /* Layer l's first tensor follows the embeddings; the final norm the last layer. */
    return m->tensors[dt_model_layer_tensor0(m, segment - 1)].offset;
}

int dt_model_segment_of(const dt_gpt *m, int tensor)
{
    if (tensor < m->embed_tensors) return 0;
    if (tensor >= m->final_norm.tensor0) return m->cfg.n_layer + 1;
    return 1 + (tensor - m->embed_tensors) / m->layer_tensors;
}
