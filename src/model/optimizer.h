/* The optimizer over a flat parameter buffer: its state (moments) in the
 * same layout, a step over a contiguous range that honours each tensor's
 * weight-decay flag, and the global gradient norm for clipping. A range lets
 * a sharded strategy (ZeRO) update only its own slice. */
#ifndef DT_MODEL_OPTIMIZER_H
#define DT_MODEL_OPTIMIZER_H

#include <stddef.h>

#include "model/gbuf.h"
#include "model/gpt.h"
#include "model/offload.h"

typedef enum { DT_OPT_ADAMW = 0, DT_OPT_ADAM, DT_OPT_SGD } dt_opt_kind;

typedef struct {
    dt_opt_kind kind;
    double beta1, beta2, eps, weight_decay, momentum;
    size_t base;    /* the state covers floats [base, base + n) of the flat layout */
    size_t n;       /* floats in each state buffer */
    float *m, *v;   /* first and second moments (SGD: m is the momentum buffer); with the
                       state offloaded, NULL but while mapped (dt_optimizer_state_map) */
    long t;         /* optimizer steps taken */
    dt_opt_store *store; /* the moments on NVMe (model/offload.h); NULL: in memory */
    int nmoments;   /* offloaded: the moments' state buffers in the store */
    float *params;  /* the parameters, where the store holds them too: NULL but while mapped */
    /* A deferred update's arguments, kept for the stream (dt_optimizer_defer_spans). */
    const dt_gpt *pending_model;
    double pending_lr;
    float pending_scale;
} dt_optimizer;

/* Parses "adamw", "adam" or "sgd"; -1 when unknown. */
int dt_opt_kind_parse(const char *name, dt_opt_kind *out);
const char *dt_opt_kind_name(dt_opt_kind k);

/* State for n floats (zeroed). 0, or -1 when memory runs out. */
int dt_optimizer_init(dt_optimizer *o, dt_opt_kind kind, size_t n, double beta1, double beta2,
                      double eps, double weight_decay, double momentum);
void dt_optimizer_free(dt_optimizer *o);
/* The same state in a file under opts->dir (ZeRO-Infinity's NVMe offload),
 * tag naming this job and rank; only the store's buffers in memory; with
 * with_params the n parameters live there too (offload_param), and the
 * update streams them. A kind without state (SGD without momentum) needs
 * no file unless it holds the parameters. 0, or -1 with
 * err (the path, and the bytes for a disk that is too small). */
int dt_optimizer_init_offload(dt_optimizer *o, dt_opt_kind kind, size_t n, double beta1,
                              double beta2, double eps, double weight_decay, double momentum,
                              const dt_offload_opts *opts, int with_params, const char *tag,
                              char *err, size_t errlen);
/* The state buffers (o->m, o->v, and o->params where held) readable and writable as memory for a
 * checkpoint: offloaded, a mapping of the file until unmap (written: the
 * values changed); in memory, nothing to do. 0, or -1 with err. */
int dt_optimizer_state_map(dt_optimizer *o, char *err, size_t errlen);
int dt_optimizer_state_unmap(dt_optimizer *o, int written, char *err, size_t errlen);

/* One step, t+1, on floats [lo, hi) of the layout, which the state must
 * cover. params and grads, like the state, start at float o->base (the
 * whole buffers when base is 0, a shard's otherwise). With
 * weight decay on the tensors that take it. grad_scale multiplies every
 * gradient first (the clipping coefficient). Exactly one call per optimizer
 * step: each call advances t, which the bias correction uses. (SGD keeps its
 * momentum buffer in m, saved under the exp_avg. names.) */
void dt_optimizer_step(dt_optimizer *o, const dt_gpt *m, float *params, dt_gbuf grads,
                       size_t lo, size_t hi, double lr, float grad_scale);

/* Step t+1 in two parts, for a rank that holds several ranges (ZeRO):
 * begin_step once, then update on each range. params and grads point at
 * float lo's values; the state at float `at` of its buffers. */
void dt_optimizer_begin_step(dt_optimizer *o);
void dt_optimizer_update(dt_optimizer *o, const dt_gpt *m, float *params, dt_gbuf grads,
                         size_t at, size_t lo, size_t hi, double lr, float grad_scale);
/* update on each span of a step (ascending in `at`), in memory or streamed
 * through the offload file. 0, or -1 with err (offload's I/O). */
int dt_optimizer_update_spans(dt_optimizer *o, const dt_gpt *m, const dt_opt_span *spans,
                              int n, double lr, float grad_scale, char *err, size_t errlen);
/* Offloaded: the same update started but not done (the store's stream
 * begun); dt_optimizer_settle then updates the state below float `upto`
 * (SIZE_MAX: all of it), waiting for its reads. The arithmetic is the
 * same, so the results are the same bits; what changes is when the disk
 * waits fall (behind compute that runs between the calls). In memory
 * (no store) defer is update_spans. 0, or -1 with err. */
int dt_optimizer_defer_spans(dt_optimizer *o, const dt_gpt *m, const dt_opt_span *spans, int n,
                             double lr, float grad_scale, char *err, size_t errlen);
int dt_optimizer_settle(dt_optimizer *o, size_t upto, char *err, size_t errlen);

/* The gradient norm in fixed blocks: each segment of the layout is cut into
 * blocks of DT_NORM_BLOCK floats from its start, each block summed by
 * dt_sum_squares_blocks, and the blocks added in layout order in double.
 * Padding adds exact zeros, so the norm is the same bits for any padding
 * and any spread of whole blocks over ranks. */
#define DT_NORM_BLOCK 1024
/* Block sums of n gradients of one segment starting at a block boundary
 * of it: ceil(n / DT_NORM_BLOCK) of them. */
void dt_norm_blocks(dt_gbuf g, size_t n, double *out);
/* The norm of a whole flat gradient buffer of m's layout. */
double dt_grad_norm(const dt_gpt *m, dt_gbuf grads);

/* PyTorch's clip_grad_norm_ coefficient: min(1, max_norm / (norm + 1e-6)),
 * or 1 when max_norm is 0 (no clipping). */
float dt_clip_coef(double norm, double max_norm);

#endif
