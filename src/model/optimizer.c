/* Optimizer state and steps over ranges of the flat layout. See optimizer.h. */
#include "model/optimizer.h"

#include <string.h>
#include <strings.h>

#include "core/alloc.h"
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

int dt_optimizer_init(dt_optimizer *o, dt_opt_kind kind, size_t n, double beta1, double beta2,
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
    int need_v = kind != DT_OPT_SGD;
    int need_m = need_v || momentum != 0.0;
    if (need_m && !(o->m = dt_alloc(n * sizeof(float), DT_MEM_OPTIM))) return -1;
    if (need_v && !(o->v = dt_alloc(n * sizeof(float), DT_MEM_OPTIM))) {
        dt_optimizer_free(o);
        return -1;
    }
    return 0;
}

void dt_optimizer_free(dt_optimizer *o)
{
    dt_free(o->m);
    dt_free(o->v);
    o->m = o->v = NULL;
}

/* Runs the update on [lo, hi) ∩ [off, off+len), one piece with one decay value. */
static void step_piece(dt_optimizer *o, float *params, const float *grads, size_t lo, size_t hi,
                       double lr, float wd, float grad_scale)
{
    size_t n = hi - lo;
    int t = (int)o->t;
    size_t at = lo - o->base; /* every buffer starts at float `base` */
    float *m = o->m ? o->m + at : NULL, *v = o->v ? o->v + at : NULL;
    params += at;
    grads += at;
    switch (o->kind) {
    case DT_OPT_ADAMW:
        dt_adamw_update(params, grads, m, v, n, (float)lr,
                        (float)o->beta1, (float)o->beta2, (float)o->eps, wd, t, grad_scale);
        break;
    case DT_OPT_ADAM:
        dt_adam_update(params, grads, m, v, n, (float)lr,
                       (float)o->beta1, (float)o->beta2, (float)o->eps, wd, t, grad_scale);
        break;
    case DT_OPT_SGD:
        dt_sgd_update(params, grads, m, n, (float)lr,
                      (float)o->momentum, wd, t, grad_scale);
        break;
    }
}

void dt_optimizer_step(dt_optimizer *o, const dt_gpt *m, float *params, const float *grads,
                       size_t lo, size_t hi, double lr, float grad_scale)
{
    o->t++;
    /* Walk the tensors that meet the range; padding between them stays zero
     * (zero gradient, zero state: every rule leaves it unchanged). */
    for (int i = 0; i < m->n_tensors; i++) {
        const dt_param_tensor *t = &m->tensors[i];
        size_t a = t->offset > lo ? t->offset : lo;
        size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b) continue;
        float wd = t->decay ? (float)o->weight_decay : 0.0f;
        step_piece(o, params, grads, a, b, lr, wd, grad_scale);
    }
}

float dt_clip_coef(double norm, double max_norm)
{
    if (max_norm <= 0.0) return 1.0f;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}
