/* GPT-2 layout, initialisation, forward and backward. See gpt.h. */
#include "model/gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/rand.h"
#include "core/str.h"
#include "core/window.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/crossentropy.h"
#include "kernels/crossentropy_split.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"

#define LN_EPS 1e-5f
/* Tensors start on 64-byte boundaries so that every kernel sees aligned rows. */
#define TENSOR_ALIGN_FLOATS 16

enum { LAYER_TENSORS = 12 };

static const char *const layer_tensor_names[LAYER_TENSORS] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias",
};

int dt_gpt_config_check(const dt_gpt_config *cfg, char *err, size_t errlen)
{
    const struct { const char *name; int v; } dims[] = {
        {"n_layer", cfg->n_layer},       {"n_head", cfg->n_head},
        {"n_embd", cfg->n_embd},         {"vocab_size", cfg->vocab_size},
        {"block_size", cfg->block_size},
    };
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
    /* Row offsets are ints in the kernels: keep every activation indexable. */
    if ((double)cfg->n_embd * 4 * cfg->block_size > 2e9 || (double)cfg->vocab_size * cfg->n_embd > 2e9) {
        dt_strf(err, errlen, "model: n_embd %d with block_size %d / vocab_size %d is too large",
                cfg->n_embd, cfg->block_size, cfg->vocab_size);
        return -1;
    }
    return 0;
}

size_t dt_gpt_param_count(const dt_gpt_config *cfg)
{
    size_t V = (size_t)cfg->vocab_size, T = (size_t)cfg->block_size, C = (size_t)cfg->n_embd;
    return V * C + T * C + (size_t)cfg->n_layer * (12 * C * C + 13 * C) + 2 * C;
}

/* The formula and why: gpt.h. */
double dt_gpt_flops_per_token(const dt_gpt_config *cfg, int T)
{
    const double L = cfg->n_layer, C = cfg->n_embd, V = cfg->vocab_size;
    const double matmul_weights = V * C + 12.0 * L * C * C;
    return 6.0 * matmul_weights + 6.0 * L * (double)T * C;
}

/* ---- layout ------------------------------------------------------------- */

/* A tensor's slice (dt_param_tensor): rows [row0, row0 + rows) of the
 * whole tensor seen as rows of columns (a 1-D tensor is one row), and of
 * each nblk blocks of cols / nblk columns, block k from col0 + k cstride. */
typedef struct {
    int row0, rows, nblk, col0, cstride, cols;
} slice;

static slice whole_tensor(int d0, int d1)
{
    return d1 > 0 ? (slice){0, d0, 1, 0, 0, d1} : (slice){0, 1, 1, 0, 0, d0};
}

static void add_tensor(dt_gpt *m, size_t *cursor, const char *name, int d0, int d1,
                       const slice *sl)
{
    dt_param_tensor *t = &m->tensors[m->n_tensors++];
    slice w = whole_tensor(d0, d1), s = sl ? *sl : w;
    dt_strf(t->name, sizeof t->name, "%s", name);
    t->offset = *cursor;
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d1 > 0 ? s.rows : s.cols;
    t->shape[1] = d1 > 0 ? s.cols : 0;
    t->gshape[0] = d0;
    t->gshape[1] = d1 > 0 ? d1 : 0;
    t->row0 = s.row0, t->nblk = s.nblk, t->col0 = s.col0, t->cstride = s.cstride;
    t->split = s.rows != w.rows || s.cols != w.cols;
    t->numel = (size_t)s.rows * (size_t)s.cols;
    t->decay = t->ndim >= 2;
    m->n_params += t->numel;
    *cursor += (t->numel + TENSOR_ALIGN_FLOATS - 1) / TENSOR_ALIGN_FLOATS * TENSOR_ALIGN_FLOATS;
}

/* Layer tensor i's slice on this rank (NULL: whole), tensor parallelism's
 * cut of gpt.h: q, k, v column blocks of its heads; MLP columns; the
 * row-parallel products' rows. */
static const slice *layer_slice(const dt_gpt *m, int i, slice *s)
{
    const int C = m->cfg.n_embd, r = m->tp.rank, A = m->tp.attn, F = m->tp.mlp;
    if (m->tp.size == 1) return NULL;
    switch (i) {
    case 2: *s = (slice){0, C, 3, r * A, C, 3 * A}; return s;  /* attn.c_attn.weight */
    case 3: *s = (slice){0, 1, 3, r * A, C, 3 * A}; return s;  /* attn.c_attn.bias */
    case 4: *s = (slice){r * A, A, 1, 0, 0, C}; return s;      /* attn.c_proj.weight */
    case 8: *s = (slice){0, C, 1, r * F, 0, F}; return s;      /* mlp.c_fc.weight */
    case 9: *s = (slice){0, 1, 1, r * F, 0, F}; return s;      /* mlp.c_fc.bias */
    case 10: *s = (slice){r * F, F, 1, 0, 0, C}; return s;     /* mlp.c_proj.weight */
    default: return NULL;
    }
}

static void build_layout(dt_gpt *m)
{
    const int C = m->cfg.n_embd;
    const int shapes[LAYER_TENSORS][2] = {
        {C, 0}, {C, 0}, {C, 3 * C}, {3 * C, 0}, {C, C},     {C, 0},
        {C, 0}, {C, 0}, {C, 4 * C}, {4 * C, 0}, {4 * C, C}, {C, 0},
    };
    size_t cursor = 0;
    char name[48];
    const size_t a = m->seg_align;
    slice vocab = {m->tp.v0, m->tp.vocab, 1, 0, 0, C}, s;
#define END_SEGMENT() (cursor = (cursor + a - 1) / a * a)
    m->n_tensors = 0;
    m->n_params = 0;
    add_tensor(m, &cursor, "wte.weight", m->cfg.vocab_size, C, &vocab);
    add_tensor(m, &cursor, "wpe.weight", m->cfg.block_size, C, NULL);
    END_SEGMENT();
    for (int l = 0; l < m->cfg.n_layer; l++) {
        for (int i = 0; i < LAYER_TENSORS; i++) {
            dt_strf(name, sizeof name, "h.%d.%s", l, layer_tensor_names[i]);
            add_tensor(m, &cursor, name, shapes[i][0], shapes[i][1], layer_slice(m, i, &s));
        }
        END_SEGMENT();
    }
    add_tensor(m, &cursor, "ln_f.weight", C, 0, NULL);
    add_tensor(m, &cursor, "ln_f.bias", C, 0, NULL);
    END_SEGMENT();
#undef END_SEGMENT
    m->n_floats = cursor;
}

int dt_gpt_pad_segments(dt_gpt *m, size_t align)
{
    if (m->params || m->grads || align == 0 || align % TENSOR_ALIGN_FLOATS != 0) {
        dt_strf(m->error, sizeof m->error,
                "model: segments can be padded only to a multiple of %d floats, before any "
                "buffer exists (asked %zu)", TENSOR_ALIGN_FLOATS, align);
        return -1;
    }
    m->seg_align = align;
    build_layout(m);
    return 0;
}

int dt_gpt_set_tp(dt_gpt *m, int rank, int size)
{
    const int NH = m->cfg.n_head, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    char ok[128];
    if (m->params || m->grads || size < 1 || rank < 0 || rank >= size)
        return dt_strf(m->error, sizeof m->error, "model: tensor parallelism is set on a "
                       "layout without buffers, rank 0 <= %d < size %d", rank, size), -1;
    if (NH % size || (4 * C) % size) {
        dt_str_divisors(ok, sizeof ok, NH);
        return dt_strf(m->error, sizeof m->error, "--tp %d: the model's %d heads (n_embd %d, "
                       "MLP width %d) do not split into %d equal parts; --tp %s would work",
                       size, NH, C, 4 * C, size, ok), -1;
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
                        .heads = NH / size, .attn = C / size, .mlp = 4 * C / size, .v0 = v0,
                        .vocab = vl, .reduce = m->tp.reduce, .ctx = m->tp.ctx};
    build_layout(m);
    return 0;
}

int dt_gpt_set_cp(dt_gpt *m, int rank, int size, dt_shard_kind kind, int saved_widths)
{
    if (m->acts_mem || size < 1 || rank < 0 || rank >= size || saved_widths < 0)
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
    m->seg_align = TENSOR_ALIGN_FLOATS;
    m->tp = (dt_gpt_tp){.rank = 0, .size = 1, .heads = cfg->n_head, .attn = cfg->n_embd,
                        .mlp = 4 * cfg->n_embd, .v0 = 0, .vocab = cfg->vocab_size};
    m->cp = (dt_gpt_cp){.rank = 0, .size = 1, .kind = DT_SHARD_CONTIGUOUS};
    m->tensors = calloc((size_t)(2 + LAYER_TENSORS * cfg->n_layer + 2), sizeof *m->tensors);
    if (!m->tensors) {
        dt_strf(err, errlen, "model: out of memory for the tensor table");
        return -1;
    }
    build_layout(m);
    return 0;
}

int dt_gpt_set_mixed(dt_gpt *m)
{
    if (m->prec != DT_PREC_BF16 || m->params || m->params16 || m->grads)
        return dt_strf(m->error, sizeof m->error, "model: mixed precision needs bf16 products "
                       "and a layout without buffers"), -1;
    if (!(m->widened = calloc((size_t)dt_gpt_segments(m), 1)))
        return dt_strf(m->error, sizeof m->error, "model: out of memory"), -1;
    m->mixed = 1;
    return 0;
}

int dt_gpt_set_grads16(dt_gpt *m)
{
    if (!m->mixed || m->grads || m->grads16)
        return dt_strf(m->error, sizeof m->error, "model: bf16 gradient accumulation needs "
                       "mixed precision and a layout without gradients"), -1;
    if (!(m->gwidened = calloc((size_t)dt_gpt_segments(m), 1)))
        return dt_strf(m->error, sizeof m->error, "model: out of memory"), -1;
    m->accum16 = 1;
    return 0;
}

dt_gbuf dt_gpt_grads(const dt_gpt *m)
{
    return m->accum16 ? (dt_gbuf){NULL, m->grads16} : dt_gbuf_f32(m->grads);
}

void dt_gpt_grads_zeroed(dt_gpt *m, size_t lo, size_t hi)
{
    for (int s = 0; m->gzero && s < dt_gpt_segments(m); s++)
        if (dt_gpt_segment_start(m, s) >= lo && dt_gpt_segment_start(m, s + 1) <= hi)
            m->gzero[s] = 1;
}

void dt_gpt_zero_grads(dt_gpt *m)
{
    dt_gbuf_zero(dt_gpt_grads(m), m->n_floats);
    dt_gpt_grads_zeroed(m, 0, m->n_floats);
}

void dt_gpt_sync_working(dt_gpt *m, size_t lo, size_t hi)
{
    if (m->mixed && hi > lo) dt_cast_f32_to_bf16(m->params16 + lo, m->params + lo, hi - lo);
}

int dt_gpt_alloc_params(dt_gpt *m)
{
    /* Reserved here, not in dt_gpt_set_mixed: padding may still grow the layout. */
    if (m->mixed && !m->wparams &&
        !(m->wparams = dt_window_reserve_pooled(m->n_floats * sizeof(float))))
        return dt_strf(m->error, sizeof m->error, "model: no address space for the widened "
                       "parameters (%.1f MiB)", (double)m->n_floats * 4 / 1048576.0), -1;
    if (m->mixed && !m->params16 &&
        !(m->params16 = dt_alloc(m->n_floats * sizeof(uint16_t), DT_MEM_PARAMS)))
        return dt_strf(m->error, sizeof m->error, "model: cannot allocate %zu bf16 parameters "
                       "(%.1f MiB)", m->n_params, (double)m->n_floats * 2 / 1048576.0), -1;
    if (m->params) return 0;
    m->params = dt_alloc(m->n_floats * sizeof(float), m->mixed ? DT_MEM_OPTIM : DT_MEM_PARAMS);
    if (m->params) return 0;
    dt_strf(m->error, sizeof m->error, "model: cannot allocate %zu %sparameters (%.1f MiB)",
            m->n_params, m->mixed ? "fp32 master " : "", (double)m->n_floats * 4 / 1048576.0);
    return -1;
}

int dt_gpt_create(dt_gpt *m, const dt_gpt_config *cfg, dt_precision prec, char *err,
                  size_t errlen)
{
    if (dt_gpt_create_layout(m, cfg, prec, err, errlen)) return -1;
    if (dt_gpt_alloc_params(m) == 0) return 0;
    dt_strf(err, errlen, "%s", m->error);
    dt_gpt_destroy(m);
    return -1;
}

void dt_gpt_destroy(dt_gpt *m)
{
    free(m->tensors);
    dt_free(m->params);
    dt_free(m->params16);
    if (m->accum16 && m->grads) {
        dt_window_free(m->grads, m->n_floats * sizeof(float));
    } else {
        dt_free(m->grads);
    }
    dt_free(m->grads16);
    if (m->wparams) dt_window_free(m->wparams, m->n_floats * sizeof(float));
    if (m->gapart) dt_window_free(m->gapart, m->n_floats * sizeof(float));
    free(m->widened);
    free(m->gwidened);
    free(m->gzero);
    free(m->gopen);
    dt_gpt_free_acts(m);
    memset(m, 0, sizeof *m);
}

int dt_gpt_alloc_grads(dt_gpt *m)
{
    size_t nseg = (size_t)dt_gpt_segments(m);
    if (!m->gzero) m->gzero = calloc(nseg, 1);
    if (!m->gopen) m->gopen = calloc(nseg, 1);
    if (!m->gzero || !m->gopen)
        return dt_strf(m->error, sizeof m->error, "model: out of memory"), -1;
    if (m->accum16) {
        if (!m->grads && !(m->grads = dt_window_reserve(m->n_floats * sizeof(float))))
            return dt_strf(m->error, sizeof m->error, "model: no address space for the "
                           "gradient window (%.1f MiB)", (double)m->n_floats * 4 / 1048576.0), -1;
        if (!m->grads16 && !(m->grads16 = dt_alloc(m->n_floats * sizeof(uint16_t), DT_MEM_GRADS)))
            return dt_strf(m->error, sizeof m->error, "model: cannot allocate bf16 gradients "
                           "(%.1f MiB)", (double)m->n_floats * 2 / 1048576.0), -1;
        return 0;
    }
    if (m->grads) return 0;
    m->grads = dt_alloc(m->n_floats * sizeof(float), DT_MEM_GRADS);
    if (!m->grads) {
        dt_strf(m->error, sizeof m->error, "model: cannot allocate gradients (%.1f MiB)",
                (double)m->n_floats * 4 / 1048576.0);
        return -1;
    }
    return 0;
}

const dt_param_tensor *dt_gpt_find(const dt_gpt *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

dt_gpt_layer dt_gpt_layer_view(const dt_gpt *m, float *flat, int layer)
{
    const dt_param_tensor *t = &m->tensors[2 + LAYER_TENSORS * layer];
    dt_gpt_layer v = {
        flat + t[0].offset, flat + t[1].offset, flat + t[2].offset,  flat + t[3].offset,
        flat + t[4].offset, flat + t[5].offset, flat + t[6].offset,  flat + t[7].offset,
        flat + t[8].offset, flat + t[9].offset, flat + t[10].offset, flat + t[11].offset,
    };
    return v;
}

static float *tensor_ptr(const dt_gpt *m, float *flat, int index)
{
    return flat + m->tensors[index].offset;
}
#define WTE(m, flat) tensor_ptr(m, flat, 0)
#define WPE(m, flat) tensor_ptr(m, flat, 1)
#define LNF_W(m, flat) tensor_ptr(m, flat, (m)->n_tensors - 2)
#define LNF_B(m, flat) tensor_ptr(m, flat, (m)->n_tensors - 1)

int dt_gpt_segments(const dt_gpt *m) { return m->cfg.n_layer + 2; }

size_t dt_gpt_segment_start(const dt_gpt *m, int segment)
{
    if (segment <= 0) return 0;
    if (segment >= m->cfg.n_layer + 2) return m->n_floats;
    /* Layer l's first tensor follows wte and wpe; ln_f follows the last layer. */
    return m->tensors[2 + LAYER_TENSORS * (segment - 1)].offset;
}

/* What forward and backward read: the parameters, or their widened copy. */
static float *weights(const dt_gpt *m) { return m->mixed ? m->wparams : m->params; }

/* Around each use of a segment's parameters: the strategy's hooks (gpt.h),
 * and with mixed precision the widened copy of the working parameters,
 * held (and accounted) from just before the use to just after. */
/* Before a backward's first gradient of a segment lands: with bf16
 * accumulation its sum so far widened into the fp32 window; with fp32
 * accumulation onto a sum that is not zero, a zeroed window segment to
 * form this micro-batch's gradient apart (dt_gpt.gapart). */
static int grads_open(dt_gpt *m, int segment)
{
    size_t lo = dt_gpt_segment_start(m, segment), hi = dt_gpt_segment_start(m, segment + 1);
    if (m->accum16) {
        if (m->gwidened[segment]) return 0;
        dt_cast_bf16_to_f32(m->grads + lo, m->grads16 + lo, hi - lo);
        m->gwidened[segment] = 1;
    } else {
        if (m->gzero[segment] || m->gopen[segment]) return 0;
        if (!m->gapart && !(m->gapart = dt_window_reserve_pooled(m->n_floats * sizeof(float))))
            return dt_strf(m->error, sizeof m->error, "model: no address space for a "
                           "micro-batch's gradients (%.1f MiB)",
                           (double)m->n_floats * 4 / 1048576.0), -1;
        dt_window_bring(m->gapart, lo * sizeof(float), hi * sizeof(float), 1);
        m->gopen[segment] = 1;
    }
    dt_mem_account(DT_MEM_GRADS, (long long)((hi - lo) * sizeof(float)));
    return 0;
}

/* Where a segment's gradients are written: its window apart, or grads. */
static float *grads_of(const dt_gpt *m, int segment)
{
    return m->gopen[segment] ? m->gapart : m->grads;
}

static int need(dt_gpt *m, int segment, int use)
{
    if (m->param_need && m->param_need(m->param_ctx, segment, use)) return -1;
    size_t lo = dt_gpt_segment_start(m, segment), hi = dt_gpt_segment_start(m, segment + 1);
    if (use == DT_USE_BACKWARD && grads_open(m, segment)) return -1;
    if (!m->mixed || use == DT_USE_INIT || m->widened[segment]) return 0;
    dt_window_bring(m->wparams, lo * sizeof(float), hi * sizeof(float), 0);
    dt_cast_bf16_to_f32(m->wparams + lo, m->params16 + lo, hi - lo);
    dt_mem_account(DT_MEM_PARAMS, (long long)((hi - lo) * sizeof(float)));
    m->widened[segment] = 1;
    return 0;
}

static void done(dt_gpt *m, int segment, int use)
{
    size_t lo = dt_gpt_segment_start(m, segment), hi = dt_gpt_segment_start(m, segment + 1);
    if (m->mixed && use == DT_USE_INIT) dt_gpt_sync_working(m, lo, hi);
    if (m->mixed && m->widened[segment]) {
        dt_window_drop(m->wparams, lo * sizeof(float), hi * sizeof(float));
        dt_mem_account(DT_MEM_PARAMS, -(long long)((hi - lo) * sizeof(float)));
        m->widened[segment] = 0;
    }
    if (m->param_done) m->param_done(m->param_ctx, segment, use);
}

/* The segment a tensor belongs to. */
static int segment_of(const dt_gpt *m, int tensor)
{
    if (tensor < 2) return 0;
    if (tensor >= m->n_tensors - 2) return m->cfg.n_layer + 1;
    return 1 + (tensor - 2) / LAYER_TENSORS;
}

/* Once this backward (or half) is through with a segment: with bf16
 * accumulation its fp32 window rounded back into grads16; a gradient
 * formed apart added into grads, its window given back. Either way the
 * accumulated sum is no longer known to be zero. */
static void segment_close(dt_gpt *m, int segment)
{
    size_t lo = dt_gpt_segment_start(m, segment), hi = dt_gpt_segment_start(m, segment + 1);
    float *win = NULL;
    m->gzero[segment] = 0;
    if (m->accum16 && m->gwidened[segment]) {
        dt_cast_f32_to_bf16(m->grads16 + lo, m->grads + lo, hi - lo);
        m->gwidened[segment] = 0;
        win = m->grads;
    } else if (m->gopen[segment]) {
        dt_gbuf_accumulate(dt_gbuf_f32(m->grads + lo), m->gapart + lo, hi - lo, 0);
        m->gopen[segment] = 0;
        win = m->gapart;
    }
    if (!win) return;
    dt_window_drop(win, lo * sizeof(float), hi * sizeof(float));
    dt_mem_account(DT_MEM_GRADS, -(long long)((hi - lo) * sizeof(float)));
}

/* The segment's gradient of this micro-batch is final. */
static void segment_report(dt_gpt *m, int segment)
{
    if (m->grad_ready)
        m->grad_ready(m->grad_ready_ctx, dt_gpt_segment_start(m, segment),
                      dt_gpt_segment_start(m, segment + 1));
}

static void segment_done(dt_gpt *m, int segment)
{
    segment_close(m, segment);
    segment_report(m, segment);
}

/* ---- initialisation ------------------------------------------------------ */

/* Standard normal by Box-Muller on 53-bit uniforms. */
static double normal01(uint64_t *state)
{
    double u1 = dt_uniform01(state) + 0.5 / 9007199254740992.0; /* (0, 1): log is finite */
    double u2 = dt_uniform01(state);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* N(0, std) values of the whole tensor from its stream, in row-major
 * order; a slice keeps its blocks of the rows it holds (the rows before
 * them are drawn and dropped), so every layout gets the same numbers. */
static void init_normal(const dt_param_tensor *t, float *p, double std, uint64_t *state)
{
    if (!t->split) {
        for (size_t k = 0; k < t->numel; k++) p[k] = (float)(std * normal01(state));
        return;
    }
    const int gcols = t->gshape[1], cols = t->shape[1], bw = cols / t->nblk;
    for (int r = 0; r < t->row0 + t->shape[0]; r++) {
        float *dst = r >= t->row0 ? p + (size_t)(r - t->row0) * cols : NULL;
        for (int c = 0, b = 0; c < gcols; c++) {
            float v = (float)(std * normal01(state));
            while (b < t->nblk && c >= t->col0 + b * t->cstride + bw) b++;
            int c0 = t->col0 + b * t->cstride;
            if (dst && b < t->nblk && c >= c0) dst[b * bw + (c - c0)] = v;
        }
    }
}

void dt_gpt_init_weights(dt_gpt *m, uint64_t seed)
{
    const double residual_std = 0.02 / sqrt(2.0 * m->cfg.n_layer);
    int seg = -1;
    for (int i = 0; i < m->n_tensors; i++) {
        const dt_param_tensor *t = &m->tensors[i];
        /* Segment by segment, so a strategy that holds a piece of each
         * keeps it and lets the rest go (nothing needs the whole model). */
        if (segment_of(m, i) != seg) {
            if (seg >= 0) done(m, seg, DT_USE_INIT);
            seg = segment_of(m, i);
            (void)need(m, seg, DT_USE_INIT);
            size_t lo = dt_gpt_segment_start(m, seg), hi = dt_gpt_segment_start(m, seg + 1);
            memset(m->params + lo, 0, (hi - lo) * sizeof(float));
        }
        float *p = m->params + t->offset;
        /* A stream per tensor: a tensor's values do not depend on the layout before it. */
        uint64_t state = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull;
        if (t->ndim == 1) {
            float v = (strstr(t->name, "ln_") && dt_ends_with(t->name, ".weight")) ? 1.0f : 0.0f;
            for (size_t k = 0; k < t->numel; k++) p[k] = v;
            continue;
        }
        double std = dt_ends_with(t->name, "c_proj.weight") ? residual_std : 0.02;
        init_normal(t, p, std, &state);
    }
    if (seg >= 0) done(m, seg, DT_USE_INIT);
}

/* ---- forward ------------------------------------------------------------ */

static void add_into(float *dst, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

static int fail_matmul(dt_gpt *m, const char *where)
{
    dt_strf(m->error, sizeof m->error, "model: %s: %s", where, dt_matmul_error());
    return -1;
}

/* buf over the tensor-parallel group (gpt.h: dt_gpt_tp); nothing unsplit. */
static int tp_reduce(dt_gpt *m, void *buf, size_t n, dt_tp_op op, const char *where)
{
    char why[200];
    if (m->tp.size == 1) return 0;
    if (!m->tp.reduce)
        return dt_strf(m->error, sizeof m->error, "model: %s: tensor parallelism without a "
                       "group to reduce over", where), -1;
    if (m->tp.reduce(m->tp.ctx, buf, n, op, why, sizeof why) == 0) return 0;
    return dt_strf(m->error, sizeof m->error, "model: %s: %s", where, why), -1;
}

/* Sequence parallelism's share of a micro-batch's N rows (gpt.h: the
 * regions between the products): R rows from row r0; all N without it. */
static size_t region_rows(const dt_gpt *m, int N)
{
    return m->tp.sp ? (size_t)N / (size_t)m->tp.size : (size_t)N;
}

static size_t region_first(const dt_gpt *m, int N)
{
    return m->tp.sp ? (size_t)m->tp.rank * region_rows(m, N) : 0;
}

/* out [R, C] = inp [N, IN] @ W + b for a row-parallel product: unsplit one
 * product; split, this rank's partial product summed over the group (with
 * sequence parallelism reduce-scattered to this rank's rows), then the
 * bias once (every rank adds it to the same sum). */
static int row_parallel(dt_gpt *m, float *out, const float *inp, const float *W,
                        const float *bias, int N, int IN, const char *name)
{
    const int C = m->cfg.n_embd, split = m->tp.size > 1;
    float *sum = m->tp.sp ? m->d_c : out; /* [N, C]: not in use while a layer runs forward */
    if (dt_linear_forward(m->prec, sum, inp, W, split ? NULL : bias, N, IN, C))
        return fail_matmul(m, name);
    if (!split) return 0;
    if (tp_reduce(m, sum, (size_t)N * C, m->tp.sp ? DT_TP_SCATTER_SUM_F32 : DT_TP_SUM_F32, name))
        return -1;
    const size_t R = region_rows(m, N);
    for (size_t i = 0; i < R; i++)
        for (int j = 0; j < C; j++) out[i * C + j] = sum[i * C + j] + bias[j];
    return 0;
}

/* A LayerNorm of this rank's rows of x into out [N, C]: all of them, or
 * with sequence parallelism its R rows into their place, the rest
 * gathered from the group (the column-parallel product after it reads
 * every row). */
static int ln_forward(dt_gpt *m, float *out, float *mean, float *rstd, const float *x,
                      const float *w, const float *b, int N, const char *name)
{
    const int C = m->cfg.n_embd;
    dt_layernorm_forward(out + region_first(m, N) * C, mean, rstd, x, w, b, LN_EPS,
                         (int)region_rows(m, N), C);
    return m->tp.sp ? tp_reduce(m, out, (size_t)N * C, DT_TP_GATHER_F32, name) : 0;
}

/* Attention over this rank's rows, t of each sequence: alone, or with the
 * rest of each sequence on the context-parallel group's ranks. */
static int attention_forward(dt_gpt *m, dt_gpt_layer_acts *a, int b, int t)
{
    const int A = m->tp.attn, NH = m->tp.heads;
    if (m->cp.size == 1) {
        dt_attention_forward(a->att, a->lse, a->qkv, b, t, A, NH);
        return 0;
    }
    return m->cp.forward(m->cp.ctx, a->att, a->lse, a->qkv, b, t * m->cp.size, A, NH, m->error,
                         sizeof m->error);
}

static int attention_backward(dt_gpt *m, const dt_gpt_layer_acts *a, int b, int t)
{
    const int A = m->tp.attn, NH = m->tp.heads;
    if (m->cp.size == 1) {
        dt_attention_backward(m->d_qkv, m->d_c, a->qkv, a->att, a->lse, b, t, A, NH);
        return 0;
    }
    return m->cp.backward(m->cp.ctx, m->d_qkv, m->d_c, a->qkv, a->att, a->lse, b,
                          t * m->cp.size, A, NH, m->error, sizeof m->error);
}

/* The parts of a layer's forward: the element-wise ones (LayerNorms, GELU),
 * the matrix products with the attention between them and the residual sum
 * res2 written in place, and the output (the MLP's c_proj and res3). A
 * forward runs all; rebuilding a layer before its backward runs what the
 * recompute mode did not keep, with the same code, so the same numbers. */
enum { RUN_ELEMENTWISE = 1, RUN_PRODUCTS = 2, RUN_OUTPUT = 4, RUN_ALL = 7 };

static int layer_run(dt_gpt *m, int l, const float *x, int b, int t, unsigned run)
{
    const int C = m->cfg.n_embd, N = b * t, A = m->tp.attn, F = m->tp.mlp;
    dt_gpt_layer w = dt_gpt_layer_view(m, weights(m), l);
    dt_gpt_layer_acts *a = &m->layer_acts[l];

    const size_t R = region_rows(m, N);
    if ((run & RUN_ELEMENTWISE) &&
        ln_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w.ln1_w, w.ln1_b, N, "ln_1"))
        return -1;
    if (run & RUN_PRODUCTS) {
        if (dt_linear_forward(m->prec, a->qkv, a->ln1, w.qkv_w, w.qkv_b, N, C, 3 * A))
            return fail_matmul(m, "attn.c_attn");
        if (attention_forward(m, a, b, t)) return -1;
        if (row_parallel(m, a->res2, a->att, w.proj_w, w.proj_b, N, A, "attn.c_proj"))
            return -1;
        add_into(a->res2, a->res2, x, R * C);
    }
    if ((run & RUN_ELEMENTWISE) &&
        ln_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w.ln2_w, w.ln2_b, N, "ln_2"))
        return -1;
    if ((run & RUN_PRODUCTS) &&
        dt_linear_forward(m->prec, a->fc, a->ln2, w.fc_w, w.fc_b, N, C, F))
        return fail_matmul(m, "mlp.c_fc");
    if (run & RUN_ELEMENTWISE) dt_gelu_forward(a->fc_gelu, a->fc, (size_t)N * F);
    if (run & RUN_OUTPUT) {
        if (row_parallel(m, a->res3, a->fc_gelu, w.fcp_w, w.fcp_b, N, F, "mlp.c_proj"))
            return -1;
        add_into(a->res3, a->res3, a->res2, R * C);
    }
    return 0;
}

static int layer_forward(dt_gpt *m, int l, const float *x, int b, int t)
{
    if (layer_run(m, l, x, b, t, RUN_ALL)) return -1;
    m->rebuilt_layer = l; /* the shared buffers, if any, hold layer l's */
    m->rebuilt_slot = m->slot;
    return 0;
}

/* What the recompute mode did not keep of layer l, rebuilt into the shared
 * buffers (the last layer's are still there from forward). */
static int layer_rebuild(dt_gpt *m, int l, const float *x, int b, int t)
{
    if (m->recompute == DT_RECOMPUTE_NONE || (m->rebuilt_layer == l && m->rebuilt_slot == m->slot))
        return 0;
    unsigned run = RUN_ELEMENTWISE;
    if (m->recompute == DT_RECOMPUTE_FULL) run |= RUN_PRODUCTS;
    if (layer_run(m, l, x, b, t, run)) return -1;
    m->rebuilt_layer = l;
    m->rebuilt_slot = m->slot;
    return 0;
}

static int check_tokens(dt_gpt *m, const int32_t *tokens, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size) {
            dt_strf(m->error, sizeof m->error,
                    "model: %s %d at position %zu is outside the vocabulary [0, %d)", what,
                    tokens[i], i, m->cfg.vocab_size);
            return -1;
        }
    }
    return 0;
}

/* The final LayerNorm and the tied head: logits = lnf(x) @ wte^T. */
static int head_forward(dt_gpt *m, const float *x, int N)
{
    const int C = m->cfg.n_embd, V = m->tp.vocab, L = m->cfg.n_layer;
    if (need(m, L + 1, DT_USE_FORWARD) || need(m, 0, DT_USE_FORWARD) ||
        ln_forward(m, m->lnf, m->lnf_mean, m->lnf_rstd, x, LNF_W(m, weights(m)),
                   LNF_B(m, weights(m)), N, "ln_f"))
        return -1;
    if (dt_matmul(m->prec, 0, 1, N, V, C, 1.0f, m->lnf, C, WTE(m, weights(m)), C, 0.0f,
                  m->logits, V))
        return fail_matmul(m, "lm_head");
    done(m, L + 1, DT_USE_FORWARD);
    done(m, 0, DT_USE_FORWARD);
    return 0;
}

/* Calls fn on each run of consecutive positions among this rank's rows
 * of b sequences of t rows: sequence bi, its rows from `row` on (of the
 * b x t), positions [pos, pos + len). Whole sequences are one run of b. */
typedef void (*rows_fn)(dt_gpt *m, const void *arg, size_t row, int pos, int nseq, int len);

static void each_run(dt_gpt *m, int b, int t, rows_fn fn, const void *arg)
{
    if (m->cp.size == 1) {
        fn(m, arg, 0, 0, b, t);
        return;
    }
    const dt_seq_rows *rows = &m->cp.rows;
    for (int bi = 0; bi < b; bi++)
        for (int c = 0, off = 0; c < rows->count; off += rows->len[c++])
            fn(m, arg, (size_t)bi * t + off, rows->begin[c], 1, rows->len[c]);
}

/* The embeddings of some rows (out [rows, C]) or their gradient d. */
typedef struct {
    float *out;
    const float *d;
    const int32_t *tokens;
} embed_rows;

static void embed_run(dt_gpt *m, const void *arg, size_t row, int pos, int nseq, int len)
{
    const embed_rows *e = arg;
    const int C = m->cfg.n_embd;
    dt_embedding_forward_range(e->out + row * C, e->tokens + row, WTE(m, weights(m)),
                               WPE(m, weights(m)) + (size_t)pos * C, nseq, len, C, m->tp.v0,
                               m->tp.vocab);
}

/* The embeddings' output into m->encoded, of b x t rows (this rank's
 * positions). Split over the vocabulary, each rank looks up the tokens of
 * its slice, zeros for the rest, and the group's sum is the whole lookup
 * (gpt.h); with sequence parallelism the sum of this rank's rows alone. */
static int embed_forward(dt_gpt *m, const int32_t *tokens, int b, int t)
{
    const int C = m->cfg.n_embd, N = b * t;
    embed_rows e = {m->tp.sp ? m->sp_full : m->encoded, NULL, tokens};
    each_run(m, b, t, embed_run, &e);
    if (!m->tp.sp) return tp_reduce(m, m->encoded, (size_t)N * C, DT_TP_SUM_F32, "wte");
    if (tp_reduce(m, e.out, (size_t)N * C, DT_TP_SCATTER_SUM_F32, "wte")) return -1;
    memcpy(m->encoded, e.out, region_rows(m, N) * C * sizeof(float));
    return 0;
}

/* Context parallelism: this rank's rows of b whole sequences of t, into
 * slot k's tokens and targets in m->cp (either may be NULL). */
static int pick_rows(dt_gpt *m, int k, const int32_t *tokens, const int32_t *targets, int b,
                     int t)
{
    dt_seq_rows *rows = &m->cp.rows;
    const size_t slot = (size_t)k * (size_t)m->B * (size_t)dt_gpt_rows(m, m->T);
    if (dt_seq_shard(rows, t, m->cp.rank, m->cp.size, m->cp.kind))
        return dt_strf(m->error, sizeof m->error, "model: sequences of %d do not split over "
                       "%d ranks of context parallelism", t, m->cp.size), -1;
    const int tl = dt_seq_rows_total(rows);
    for (int bi = 0; bi < b; bi++)
        for (int c = 0, off = 0; c < rows->count; off += rows->len[c++]) {
            size_t from = (size_t)bi * t + rows->begin[c], to = slot + (size_t)bi * tl + off;
            size_t bytes = (size_t)rows->len[c] * sizeof(int32_t);
            if (tokens) memcpy(m->cp.tokens + to, tokens + from, bytes);
            if (targets) memcpy(m->cp.targets + to, targets + from, bytes);
        }
    return 0;
}

/* The sum of the rows' losses, or -1. Split over the vocabulary, the rows'
 * max and then their sums of exponentials and target logits are reduced
 * over the group (kernels/crossentropy_split.h); the exponentials stay in
 * the logits' place and the sums in ce_sums, for backward. */
static double head_loss(dt_gpt *m, const int32_t *targets, int N)
{
    const int V = m->cfg.vocab_size, Vl = m->tp.vocab, v0 = m->tp.v0;
    if (m->tp.size == 1) return dt_crossentropy(NULL, m->losses, m->logits, targets, N, V, 0.0f);
    dt_crossentropy_split_max(m->ce_max, m->logits, N, Vl);
    if (tp_reduce(m, m->ce_max, (size_t)N, DT_TP_MAX_F32, "loss (max)")) return -1;
    dt_crossentropy_split_sums(m->ce_sums, m->ce_sums + N, m->logits, m->logits, m->ce_max,
                               targets, N, Vl, v0, V);
    if (tp_reduce(m, m->ce_sums, 2 * (size_t)N, DT_TP_SUM_F64, "loss (sums)")) return -1;
    return dt_crossentropy_split_losses(m->losses, m->ce_max, m->ce_sums, m->ce_sums + N,
                                        targets, N, V);
}

static int check_slot(dt_gpt *m, int k, int b, int t)
{
    if (m->acts_mem && k >= 0 && k < m->nslots && b > 0 && t > 0 && b <= m->B && t <= m->T)
        return 0;
    return dt_strf(m->error, sizeof m->error, "model: forward of %d x %d in slot %d exceeds "
                   "the arena (%d slots of %d x %d)", b, t, k, m->nslots, m->B, m->T), -1;
}

double dt_gpt_forward_slot(dt_gpt *m, int k, const int32_t *tokens, const int32_t *targets,
                           int b, int t)
{
    const int L = m->cfg.n_layer;
    if (check_slot(m, k, b, t)) return -1;
    dt_gpt_slot *st = &m->slots[k];
    const int embed = st->part.l0 == 0, head = st->part.l1 == L;
    if (embed && (!tokens || check_tokens(m, tokens, (size_t)b * t, "token"))) return -1;
    if (head && targets && check_tokens(m, targets, (size_t)b * t, "target")) return -1;
    const int32_t *rows_tokens = tokens, *rows_targets = targets;
    st->tokens = tokens; /* the caller's: backward checks it gets the same */
    if (m->cp.size > 1) {
        const size_t slot = (size_t)k * (size_t)m->B * (size_t)dt_gpt_rows(m, m->T);
        if (pick_rows(m, k, tokens, targets, b, t)) return -1;
        rows_tokens = m->cp.tokens + slot;
        rows_targets = targets ? m->cp.targets + slot : NULL;
        t = dt_gpt_rows(m, t);
    }
    st->row_tokens = rows_tokens;
    const int N = b * t;
    dt_gpt_bind_slot(m, k);
    m->rebuilt_layer = -1;
    if (embed) {
        if (need(m, 0, DT_USE_FORWARD) || embed_forward(m, rows_tokens, b, t)) return -1;
        done(m, 0, DT_USE_FORWARD);
    }
    const float *x = m->encoded;
    for (int l = st->part.l0; l < st->part.l1; l++) {
        if (need(m, 1 + l, DT_USE_FORWARD) || layer_forward(m, l, x, b, t)) return -1;
        done(m, 1 + l, DT_USE_FORWARD);
        x = m->layer_acts[l].res3;
    }
    st->targets = head ? rows_targets : NULL;
    st->b = b;
    st->t = t;
    if (!head) return 0;
    if (head_forward(m, x, N)) return -1;
    if (!targets) return 0;
    return head_loss(m, rows_targets, N) / N;
}

double dt_gpt_forward(dt_gpt *m, const int32_t *tokens, const int32_t *targets, int b, int t)
{
    return dt_gpt_forward_slot(m, 0, tokens, targets, b, t);
}

/* ---- backward ----------------------------------------------------------- */

/* One product's share of a backward: dinp = dout @ W^T, and dW, db. A
 * split backward's input half leaves dW and db for later and keeps dout in
 * `keep`; its weight half (product_weights) takes dout from there. */
static int product_backward(dt_gpt *m, dt_bwd_part what, float *dinp, float *dW, float *db,
                            const float *dout, float *keep, const float *inp, const float *W,
                            int N, int IN, int OUT, const char *name)
{
    const int whole = what == DT_BWD_WHOLE;
    if (!whole) memcpy(keep, dout, (size_t)N * OUT * sizeof(float));
    if (dt_linear_backward(m->prec, dinp, 0, whole ? dW : NULL, whole ? db : NULL, dout, inp, W,
                           N, IN, OUT))
        return fail_matmul(m, name);
    return 0;
}

static int product_weights(dt_gpt *m, float *dW, float *db, const float *dout, const float *inp,
                           int N, int IN, int OUT, const char *name)
{
    if (dt_linear_backward(m->prec, NULL, 0, dW, db, dout, inp, NULL, N, IN, OUT))
        return fail_matmul(m, name);
    return 0;
}

/* The gradient of a column-parallel product's input, m->d_c [N, C]: the
 * ranks' partial sums summed over the group, or with sequence parallelism
 * reduce-scattered (this rank's rows at m->d_c's start). */
static int input_grad_sum(dt_gpt *m, int N, const char *name)
{
    return tp_reduce(m, m->d_c, (size_t)N * m->cfg.n_embd,
                     m->tp.sp ? DT_TP_SCATTER_SUM_F32 : DT_TP_SUM_F32, name);
}

/* A region's gradient d [R, C] as every row's [N, C]: d itself, or with
 * sequence parallelism gathered from the group into m->sp_full (a
 * row-parallel product's backward reads every row). NULL on failure. */
static const float *rows_gathered(dt_gpt *m, const float *d, int N, const char *name)
{
    if (!m->tp.sp) return d;
    const size_t C = (size_t)m->cfg.n_embd, r0 = region_first(m, N);
    memcpy(m->sp_full + r0 * C, d, region_rows(m, N) * C * sizeof(float));
    return tp_reduce(m, m->sp_full, (size_t)N * C, DT_TP_GATHER_F32, name) ? NULL : m->sp_full;
}

/* A LayerNorm's backward from m->d_c (this rank's rows), adding its input's
 * gradient into m->d_res (the residual's) and its weights' into gw, gb.
 * With sequence parallelism those are of this rank's rows alone: this
 * micro-batch's are summed over the group before they join the others. */
static int ln_backward(dt_gpt *m, float *gw, float *gb, const float *inp, const float *w,
                       const float *mean, const float *rstd, int N, const char *name)
{
    const int C = m->cfg.n_embd, R = (int)region_rows(m, N);
    if (!m->tp.sp) {
        dt_layernorm_backward(m->d_res, gw, gb, m->d_c, inp, w, mean, rstd, R, C);
        return 0;
    }
    float *part = m->sp_ln;
    memset(part, 0, 2 * (size_t)C * sizeof(float));
    dt_layernorm_backward(m->d_res, part, part + C, m->d_c, inp, w, mean, rstd, R, C);
    if (tp_reduce(m, part, 2 * (size_t)C, DT_TP_SUM_F32, name)) return -1;
    for (int j = 0; j < C; j++) {
        gw[j] += part[j];
        gb[j] += part[C + j];
    }
    return 0;
}

/* The weight half of layer l's split backward: its four products' weight
 * and bias gradients, in the order the whole backward adds them. */
static int layer_weights(dt_gpt *m, int l, const float *x, int b, int t)
{
    const int C = m->cfg.n_embd, N = b * t, A = m->tp.attn, F = m->tp.mlp;
    dt_gpt_layer g = dt_gpt_layer_view(m, grads_of(m, 1 + l), l);
    const dt_gpt_layer_acts *a = &m->layer_acts[l];
    if (layer_rebuild(m, l, x, b, t)) return -1;
    if (product_weights(m, g.fcp_w, g.fcp_b, a->d_fcp, a->fc_gelu, N, F, C, "mlp.c_proj") ||
        product_weights(m, g.fc_w, g.fc_b, a->d_fc, a->ln2, N, C, F, "mlp.c_fc") ||
        product_weights(m, g.proj_w, g.proj_b, a->d_proj, a->att, N, A, C, "attn.c_proj") ||
        product_weights(m, g.qkv_w, g.qkv_b, a->d_qkv, a->ln1, N, C, 3 * A, "attn.c_attn"))
        return -1;
    return 0;
}

/* Layer l from d(res3) in m->d_res to d(input) in m->d_res: the whole
 * backward, or its input half. */
static int layer_backward(dt_gpt *m, int l, const float *x, int b, int t, dt_bwd_part what)
{
    const int C = m->cfg.n_embd, N = b * t, A = m->tp.attn, F = m->tp.mlp;
    dt_gpt_layer w = dt_gpt_layer_view(m, weights(m), l);
    dt_gpt_layer g = dt_gpt_layer_view(m, grads_of(m, 1 + l), l);
    dt_gpt_layer_acts *a = &m->layer_acts[l];
    if (layer_rebuild(m, l, x, b, t)) return -1;

    /* m->d_res holds d(res3); the MLP branch first. Split, the products'
     * input gradients are partial sums until reduced over the group. */
    const float *d_out = rows_gathered(m, m->d_res, N, "mlp.c_proj backward");
    if (!d_out ||
        product_backward(m, what, m->d_fc, g.fcp_w, g.fcp_b, d_out, a->d_fcp, a->fc_gelu,
                         w.fcp_w, N, F, C, "mlp.c_proj backward"))
        return -1;
    dt_gelu_backward(m->d_fc, a->fc, m->d_fc, (size_t)N * F);
    if (product_backward(m, what, m->d_c, g.fc_w, g.fc_b, m->d_fc, a->d_fc, a->ln2, w.fc_w, N, C,
                         F, "mlp.c_fc backward") ||
        input_grad_sum(m, N, "mlp.c_fc backward") ||
        ln_backward(m, g.ln2_w, g.ln2_b, a->res2, w.ln2_w, a->ln2_mean, a->ln2_rstd, N,
                    "ln_2 backward"))
        return -1;

    /* m->d_res now holds d(res2); the attention branch. */
    if (!(d_out = rows_gathered(m, m->d_res, N, "attn.c_proj backward")) ||
        product_backward(m, what, m->d_c, g.proj_w, g.proj_b, d_out, a->d_proj, a->att,
                         w.proj_w, N, A, C, "attn.c_proj backward"))
        return -1;
    if (attention_backward(m, a, b, t)) return -1;
    if (product_backward(m, what, m->d_c, g.qkv_w, g.qkv_b, m->d_qkv, a->d_qkv, a->ln1, w.qkv_w,
                         N, C, 3 * A, "attn.c_attn backward") ||
        input_grad_sum(m, N, "attn.c_attn backward") ||
        ln_backward(m, g.ln1_w, g.ln1_b, x, w.ln1_w, a->ln1_mean, a->ln1_rstd, N,
                    "ln_1 backward"))
        return -1;
    return 0;
}

/* From the loss to d(input of ln_f) in m->d_res: the logits' gradient in
 * place, the tied head's into wte's (not in an input half: the logits'
 * gradient stays in the slot for the weight half), the final LayerNorm's. */
static int head_backward(dt_gpt *m, const dt_gpt_slot *st, const float *lnf_in, float grad_scale,
                         dt_bwd_part what)
{
    const int C = m->cfg.n_embd, V = m->tp.vocab, L = m->cfg.n_layer, N = st->b * st->t;
    /* An input half reads wte but adds nothing to its gradient yet. */
    const int wte_use = what == DT_BWD_INPUT ? DT_USE_FORWARD : DT_USE_BACKWARD;
    if (m->tp.size == 1)
        dt_crossentropy(m->logits, m->losses, m->logits, st->targets, N, V, grad_scale);
    else
        dt_crossentropy_split_backward(m->logits, m->logits, m->ce_sums, st->targets, N, V,
                                       m->tp.v0, m->cfg.vocab_size, grad_scale);
    if (need(m, L + 1, DT_USE_BACKWARD) || need(m, 0, wte_use)) return -1;
    /* dlnf = dlogits @ wte; dwte += dlogits^T @ lnf. */
    if (dt_matmul(m->prec, 0, 0, N, C, V, 1.0f, m->logits, V, WTE(m, weights(m)), C, 0.0f, m->d_c,
                  C) ||
        (what == DT_BWD_WHOLE && dt_matmul(m->prec, 1, 0, V, C, N, 1.0f, m->logits, V, m->lnf, C,
                                           1.0f, WTE(m, grads_of(m, 0)), C)))
        return fail_matmul(m, "lm_head backward");
    memset(m->d_res, 0, (size_t)N * C * sizeof(float));
    float *g_lnf = grads_of(m, L + 1);
    if (input_grad_sum(m, N, "lm_head backward") ||
        ln_backward(m, LNF_W(m, g_lnf), LNF_B(m, g_lnf), lnf_in, LNF_W(m, weights(m)),
                    m->lnf_mean, m->lnf_rstd, N, "ln_f backward"))
        return -1;
    done(m, 0, wte_use);
    done(m, L + 1, DT_USE_BACKWARD);
    return 0;
}

/* The head's weight half: the tied head's share of wte's gradient. */
static int head_weights(dt_gpt *m, const dt_gpt_slot *st)
{
    const int C = m->cfg.n_embd, V = m->tp.vocab, N = st->b * st->t;
    if (grads_open(m, 0)) return -1;
    if (dt_matmul(m->prec, 1, 0, V, C, N, 1.0f, m->logits, V, m->lnf, C, 1.0f,
                  WTE(m, grads_of(m, 0)), C))
        return fail_matmul(m, "lm_head backward (weights)");
    return 0;
}

static int check_backward(dt_gpt *m, int k, const float *d_out, dt_bwd_part what)
{
    const dt_gpt_slot *st = k >= 0 && k < m->nslots ? &m->slots[k] : NULL;
    if (!m->grads || !m->gzero || !st || !st->b ||
        (what != DT_BWD_WEIGHTS && (st->part.l1 == m->cfg.n_layer ? !st->targets : !d_out)))
        return dt_strf(m->error, sizeof m->error, "model: backward needs gradients "
                       "(dt_gpt_alloc_grads), a forward in slot %d, and its targets or the "
                       "output's gradient", k), -1;
    if (what != DT_BWD_WHOLE && !m->acts_split)
        return dt_strf(m->error, sizeof m->error, "model: a split backward needs slots carved "
                       "with split_backward"), -1;
    if ((what == DT_BWD_WEIGHTS) != st->weights_pending)
        return dt_strf(m->error, sizeof m->error, "model: slot %d: %s", k, st->weights_pending
                       ? "the weight half of its backward is still to run"
                       : "the weight half of a backward needs its input half first"), -1;
    return 0;
}

/* The embeddings' gradients from that of their output, d [b*t, C] (whole
 * on every rank of tensor parallelism, gathered first under sequence
 * parallelism: each adds its vocabulary slice's rows and all of wpe;
 * context parallelism: its rows' positions). */

static void embed_grad_run(dt_gpt *m, const void *arg, size_t row, int pos, int nseq, int len)
{
    const embed_rows *g = arg;
    const int C = m->cfg.n_embd;
    float *grads = grads_of(m, 0);
    dt_embedding_backward_range(WTE(m, grads), WPE(m, grads) + (size_t)pos * C,
                                g->d + row * C, g->tokens + row, nseq, len, C, m->tp.v0,
                                m->tp.vocab);
}

static int embed_backward(dt_gpt *m, const float *d, const dt_gpt_slot *st)
{
    embed_rows g = {NULL, rows_gathered(m, d, st->b * st->t, "wte backward"), st->row_tokens};
    if (!g.d || grads_open(m, 0)) return -1;
    each_run(m, st->b, st->t, embed_grad_run, &g);
    segment_done(m, 0);
    return 0;
}

/* The input half (or the whole) of slot k's backward: from the loss or
 * d_out down to the part's input. */
static int backward_input(dt_gpt *m, dt_gpt_slot *st, const float *d_out, float grad_scale,
                          dt_bwd_part what)
{
    const int C = m->cfg.n_embd, L = m->cfg.n_layer, N = st->b * st->t;
    const int whole = what == DT_BWD_WHOLE, embed = st->part.l0 == 0;
    if (st->part.l1 == L) {
        const float *lnf_in = st->part.l1 > st->part.l0 ? m->layer_acts[L - 1].res3 : m->encoded;
        if (head_backward(m, st, lnf_in, grad_scale, what)) return -1;
        segment_close(m, L + 1);
        if (whole) segment_report(m, L + 1);
        if (whole && !embed) segment_done(m, 0); /* a tied copy: its part is final */
    } else {
        memcpy(m->d_res, d_out, (size_t)N * C * sizeof(float));
    }
    for (int l = st->part.l1 - 1; l >= st->part.l0; l--) {
        const float *x = l > st->part.l0 ? m->layer_acts[l - 1].res3 : m->encoded;
        if (need(m, 1 + l, DT_USE_BACKWARD) || layer_backward(m, l, x, st->b, st->t, what))
            return -1;
        done(m, 1 + l, DT_USE_BACKWARD);
        segment_close(m, 1 + l);
        if (whole) segment_report(m, 1 + l);
    }
    st->input_grad_apart = !whole;
    if (!whole || !embed) {
        memcpy(whole ? m->encoded : m->dinput, m->d_res, (size_t)N * C * sizeof(float));
        return 0;
    }
    return embed_backward(m, m->d_res, st);
}

/* The weight half of slot k's backward; reports each segment in the order
 * the whole backward does. Layers are rebuilt (in a recompute mode) from
 * inputs the slot still holds. */
static int backward_weights(dt_gpt *m, dt_gpt_slot *st)
{
    const int L = m->cfg.n_layer, embed = st->part.l0 == 0;
    if (st->part.l1 == L) {
        if (head_weights(m, st)) return -1;
        segment_report(m, L + 1);
        if (!embed) segment_done(m, 0);
    }
    for (int l = st->part.l1 - 1; l >= st->part.l0; l--) {
        const float *x = l > st->part.l0 ? m->layer_acts[l - 1].res3 : m->encoded;
        /* The weights are read only to rebuild the layer. */
        const int rebuild = m->recompute != DT_RECOMPUTE_NONE;
        if (rebuild && need(m, 1 + l, DT_USE_BACKWARD)) return -1;
        if (!rebuild && grads_open(m, 1 + l)) return -1;
        if (layer_weights(m, l, x, st->b, st->t)) return -1;
        if (rebuild) done(m, 1 + l, DT_USE_BACKWARD);
        segment_done(m, 1 + l);
    }
    if (!embed) return 0;
    return embed_backward(m, m->dinput, st);
}

int dt_gpt_backward_part(dt_gpt *m, int k, const float *d_out, float grad_scale,
                         dt_bwd_part what)
{
    if (check_backward(m, k, d_out, what)) return -1;
    dt_gpt_slot *st = &m->slots[k];
    dt_gpt_bind_slot(m, k);
    if (what == DT_BWD_WEIGHTS ? backward_weights(m, st)
                               : backward_input(m, st, d_out, grad_scale, what))
        return -1;
    st->weights_pending = what == DT_BWD_INPUT;
    if (what != DT_BWD_INPUT) st->b = 0;
    return 0;
}

int dt_gpt_backward_slot(dt_gpt *m, int k, const float *d_out, float grad_scale)
{
    return dt_gpt_backward_part(m, k, d_out, grad_scale, DT_BWD_WHOLE);
}

int dt_gpt_backward(dt_gpt *m, const int32_t *tokens, int b, int t, float grad_scale)
{
    const dt_gpt_slot *st = m->nslots > 0 ? &m->slots[0] : NULL;
    if (st && st->b && (tokens != st->tokens || b != st->b || dt_gpt_rows(m, t) != st->t))
        return dt_strf(m->error, sizeof m->error,
                       "model: backward of %d x %d does not match the last forward (%d x %d, "
                       "other tokens?)", b, t, st->b, st->t * m->cp.size), -1;
    return dt_gpt_backward_slot(m, 0, NULL, grad_scale);
}
