/* Optimizer state and steps over ranges of the flat layout. See optimizer.h. */
#include "model/optimizer.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/fault.h"
#include "kernels/optimizer.h"

static const char *const kind_names[] = {"adamw", "adam", "sgd"};

int dt_opt_kind_parse(const char *name, dt_opt_kind *out)
{
    for (int k = 0; k < 3; k++) {
        if (strcasecmp(name, kind_names[k]) == 0) {
            *out = (dt_opt_kind)k;
            return 0;
        }
    }
    return -1;
}

const char *dt_opt_kind_name(dt_opt_kind k) { return kind_names[k]; }

/* The settings, and how many state buffers the kind keeps: 2 (Adam's
 * moments), 1 (SGD's momentum) or 0. */
static int setup(dt_optimizer *o, dt_opt_kind kind, size_t n, double beta1, double beta2,
                 double eps, double weight_decay, double momentum)
{
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->eps = eps;
    o->weight_decay = weight_decay;
    o->momentum = momentum;
    o->n = n;
    return kind != DT_OPT_SGD ? 2 : momentum != 0.0 ? 1 : 0;
}

int dt_optimizer_init(dt_optimizer *o, dt_opt_kind kind, size_t n, double beta1, double beta2,
                      double eps, double weight_decay, double momentum)
{
    int states = setup(o, kind, n, beta1, beta2, eps, weight_decay, momentum);
    int need_v = states == 2, need_m = states >= 1;
    if (need_m && !(o->m = dt_alloc(n * sizeof(float), DT_MEM_OPTIM))) return -1;
    if (need_v && !(o->v = dt_alloc(n * sizeof(float), DT_MEM_OPTIM))) {
        dt_optimizer_free(o);
        return -1;
    }
    return 0;
}

void dt_optimizer_free(dt_optimizer *o)
{
    if (o->store) {
        dt_opt_store_destroy(o->store); /* a mapping's pointers go with it */
        o->store = NULL;
    } else {
        dt_free(o->m);
        dt_free(o->v);
    }
    o->m = o->v = NULL;
}

int dt_optimizer_init_offload(dt_optimizer *o, dt_opt_kind kind, size_t n, double beta1,
                              double beta2, double eps, double weight_decay, double momentum,
                              const dt_offload_opts *opts, int with_params, const char *tag,
                              char *err, size_t errlen)
{
    int states = setup(o, kind, n, beta1, beta2, eps, weight_decay, momentum);
    if ((states == 0 && !with_params) || n == 0) return 0;
    o->nmoments = states;
    return dt_opt_store_create(&o->store, opts, tag, states, with_params, n, err, errlen);
}

int dt_optimizer_state_map(dt_optimizer *o, char *err, size_t errlen)
{
    if (!o->store) return 0;
    float *states[3] = {NULL, NULL, NULL};
    if (dt_opt_store_map(o->store, states, err, errlen)) return -1;
    o->m = o->nmoments > 0 ? states[0] : NULL;
    o->v = o->nmoments > 1 ? states[1] : NULL;
    o->params = dt_opt_store_has_params(o->store) ? states[o->nmoments] : NULL;
    return 0;
}

int dt_optimizer_state_unmap(dt_optimizer *o, int written, char *err, size_t errlen)
{
    if (!o->store) return 0;
    o->m = o->v = o->params = NULL;
    return dt_opt_store_unmap(o->store, written, err, errlen);
}

/* One piece of the update: floats [lo, hi), one decay value; params and
 * grads point at lo's values, the state at `at`. The rules are element-wise,
 * so bf16 gradients widened a chunk at a time give the same numbers. */
static void step_piece(dt_optimizer *o, float *params, dt_gbuf grads, float *ms, float *vs,
                       size_t n, double lr, float wd, float grad_scale)
{
    int t = (int)o->t;
    float scratch[DT_GBUF_CHUNK];
    size_t step = grads.f32 ? n : DT_GBUF_CHUNK;
    for (size_t k = 0; k < n; k += step) {
        size_t c = n - k < step ? n - k : step;
        const float *g = dt_gbuf_view(dt_gbuf_at(grads, k), c, scratch);
        float *p = params + k;
        float *m = ms ? ms + k : NULL, *v = vs ? vs + k : NULL;
        switch (o->kind) {
        case DT_OPT_ADAMW:
            dt_adamw_update(p, g, m, v, c, (float)lr, (float)o->beta1, (float)o->beta2,
                            (float)o->eps, wd, t, grad_scale);
            break;
        case DT_OPT_ADAM:
            dt_adam_update(p, g, m, v, c, (float)lr, (float)o->beta1, (float)o->beta2,
                           (float)o->eps, wd, t, grad_scale);
            break;
        case DT_OPT_SGD:
            dt_sgd_update(p, g, m, c, (float)lr, (float)o->momentum, wd, t, grad_scale);
            break;
        }
    }
}

void dt_optimizer_begin_step(dt_optimizer *o) { o->t++; }

/* Floats [lo, hi) with their state at ms, vs (either NULL where the kind
 * keeps none). Walks the tensors that meet the range, so weight decay
 * follows each tensor wherever the range cuts it; padding between them
 * stays zero (zero gradient, zero state: every rule leaves it unchanged). */
static void update_range(dt_optimizer *o, const dt_gpt *m, float *params, dt_gbuf grads,
                         float *ms, float *vs, size_t lo, size_t hi, double lr, float grad_scale)
{
    for (int i = 0; i < m->n_tensors; i++) {
        const dt_param_tensor *t = &m->tensors[i];
        size_t a = t->offset > lo ? t->offset : lo;
        size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b) continue;
        float wd = t->decay ? (float)o->weight_decay : 0.0f;
        size_t k = a - lo;
        step_piece(o, params + k, dt_gbuf_at(grads, k), ms ? ms + k : NULL, vs ? vs + k : NULL,
                   b - a, lr, wd, grad_scale);
    }
}

void dt_optimizer_update(dt_optimizer *o, const dt_gpt *m, float *params, dt_gbuf grads,
                         size_t at, size_t lo, size_t hi, double lr, float grad_scale)
{
    update_range(o, m, params, grads, o->m ? o->m + at : NULL, o->v ? o->v + at : NULL, lo, hi,
                 lr, grad_scale);
    dt_fault_point("update"); /* a range updated, maybe not all of them */
}

typedef struct {
    dt_optimizer *o;
    const dt_gpt *m;
    double lr;
    float grad_scale;
} piece_ctx;

static void update_piece(void *ctx, const dt_opt_span *p, float *const *states)
{
    piece_ctx *c = ctx;
    int n = c->o->kind != DT_OPT_SGD ? 2 : 1;
    update_range(c->o, c->m, p->params, p->grads, states[0], n > 1 ? states[1] : NULL, p->lo,
                 p->hi, c->lr, c->grad_scale);
}

int dt_optimizer_update_spans(dt_optimizer *o, const dt_gpt *m, const dt_opt_span *spans,
                              int n, double lr, float grad_scale, char *err, size_t errlen)
{
    if (!o->store) {
        for (int i = 0; i < n; i++)
            dt_optimizer_update(o, m, spans[i].params, spans[i].grads, spans[i].at, spans[i].lo,
                                spans[i].hi, lr, grad_scale);
        return 0;
    }
    piece_ctx c = {o, m, lr, grad_scale};
    return dt_opt_store_step(o->store, spans, n, update_piece, &c, err, errlen);
}

/* The deferred stream's pieces: the arguments kept in the optimizer. */
static void update_pending(void *ctx, const dt_opt_span *p, float *const *states)
{
    dt_optimizer *o = ctx;
    piece_ctx c = {o, o->pending_model, o->pending_lr, o->pending_scale};
    update_piece(&c, p, states);
}

int dt_optimizer_defer_spans(dt_optimizer *o, const dt_gpt *m, const dt_opt_span *spans, int n,
                             double lr, float grad_scale, char *err, size_t errlen)
{
    if (!o->store) return dt_optimizer_update_spans(o, m, spans, n, lr, grad_scale, err, errlen);
    o->pending_model = m, o->pending_lr = lr, o->pending_scale = grad_scale;
    return dt_opt_store_begin(o->store, spans, n, update_pending, o, err, errlen);
}

int dt_optimizer_settle(dt_optimizer *o, size_t upto, char *err, size_t errlen)
{
    if (!o || !o->store || !dt_opt_store_pending(o->store)) return 0;
    return upto == SIZE_MAX ? dt_opt_store_end(o->store, err, errlen)
                            : dt_opt_store_advance(o->store, upto, err, errlen);
}

void dt_optimizer_step(dt_optimizer *o, const dt_gpt *m, float *params, dt_gbuf grads,
                       size_t lo, size_t hi, double lr, float grad_scale)
{
    dt_optimizer_begin_step(o);
    size_t at = lo - o->base; /* every buffer starts at float `base` */
    dt_optimizer_update(o, m, params + at, dt_gbuf_at(grads, at), at, lo, hi, lr, grad_scale);
}

void dt_norm_blocks(dt_gbuf g, size_t n, double *out)
{
    if (g.f32) {
        dt_sum_squares_blocks(g.f32, n, DT_NORM_BLOCK, out);
        return;
    }
    float scratch[DT_GBUF_CHUNK]; /* whole blocks at a time: the same block sums */
    for (size_t k = 0; k < n; k += DT_GBUF_CHUNK) {
        size_t c = n - k < DT_GBUF_CHUNK ? n - k : DT_GBUF_CHUNK;
        dt_sum_squares_blocks(dt_gbuf_view(dt_gbuf_at(g, k), c, scratch), c, DT_NORM_BLOCK,
                              out + k / DT_NORM_BLOCK);
    }
}

double dt_grad_norm(const dt_gpt *m, dt_gbuf grads)
{
    enum { CHUNK = 256 }; /* blocks summed per call */
    double blk[CHUNK], sum = 0.0;
    for (int s = 0; s < dt_gpt_segments(m); s++) {
        size_t hi = dt_gpt_segment_start(m, s + 1);
        for (size_t lo = dt_gpt_segment_start(m, s); lo < hi; lo += CHUNK * DT_NORM_BLOCK) {
            size_t end = hi - lo > CHUNK * DT_NORM_BLOCK ? lo + CHUNK * DT_NORM_BLOCK : hi;
            size_t nb = (end - lo + DT_NORM_BLOCK - 1) / DT_NORM_BLOCK;
            dt_norm_blocks(dt_gbuf_at(grads, lo), end - lo, blk);
            for (size_t k = 0; k < nb; k++) sum += blk[k];
        }
    }
    return sqrt(sum);
}

float dt_clip_coef(double norm, double max_norm)
{
    if (max_norm <= 0.0) return 1.0f;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}
