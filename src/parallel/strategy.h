/* How a rank takes part in training: one interface that every way of
 * sharing the work implements, so the trainer runs any of them, and any
 * combination, without knowing which.
 *
 * A rank's strategy is a stack of layers (at most DT_STRATEGY_MAX_LAYERS),
 * each an implementation of dt_strategy_ops with its own state. The trainer
 * calls the dt_strategy_* functions below; each calls the hook of every
 * layer that has one, in stack order, so layers compose: a layer that
 * reduces gradients over one group and a layer that splits the model over
 * another need no knowledge of each other. Some hooks decide a single thing
 * for the rank (who runs the micro-batches, who computes the gradient norm,
 * who updates the parameters, who serves instead of training): at most one
 * layer may own each, checked when the layer is added, and without an
 * owner the default below runs. An empty stack is training in one process.
 *
 * What a rank holds and updates is data that the layers narrow in turn,
 * from the top of the stack down (a pipeline keeps a stage's ranges, ZeRO
 * below it keeps its pieces of those): `held`, `shard`, `owned` below.
 * The default norm and update run over that data, so layers that split
 * the model and layers that shard it compose without knowing each other.
 *
 * Life of a run, as the trainer drives it:
 *   build (registry.c: the layers from the options, before any model)
 *   relayout  every layer may pad the layout's segments (ZeRO's pieces)
 *   plan      what of the model and optimizer this rank holds (dt_share),
 *             from the top layer down; may be collective (the parameter
 *             server splits the job here)
 *   -- the trainer allocates what the share says and loads the starting
 *      weights (initialisation, --init, or a checkpoint) --
 *   start     the ranks agree on the starting state (DDP broadcasts it)
 *   each step: dt_strategy_step (begin_step; the micro-batches with
 *             before_backward around each backward; end_grads; the loss
 *             averaged over the lockstep group; grad_norm; update)
 *   before_save / end / gather_params (before the final weights are written)
 *   / release / replicas_identical / destroy
 * docs/design.md says how to add a strategy. */
#ifndef DT_PARALLEL_STRATEGY_H
#define DT_PARALLEL_STRATEGY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain/comm.h"
#include "model/gpt.h"
#include "model/ranges.h"
#include "model/optimizer.h"

#define DT_STRATEGY_MAX_LAYERS 6

/* What the trainer hands the strategies of a rank. The trainer owns it and
 * every buffer it points to; hooks write their failure messages to err. */
typedef struct dt_rank {
    dt_comm *world; /* the job; NULL in one process */
    int rank, size;
    dt_gpt *model;      /* the layout from plan on; parameters and more as the share says */
    dt_optimizer *opt;  /* state over the share's optimizer range (n == 0: none) */
    int B, T, accum;    /* micro-batch shape, micro-batches per optimizer step */
    int32_t *inputs, *targets; /* one micro-batch, B x T each */
    /* Fills n sequences of training data, starting at position `first` of
     * the training order, into inputs and targets. 0 or -1 with err. */
    int (*batch)(void *ctx, uint64_t first, int n, int32_t *inputs, int32_t *targets, char *err,
                 size_t errlen);
    void *batch_ctx;
    double (*lr_at)(const void *ctx, long step); /* the schedule, for ranks that update */
    const void *lr_ctx;
    double grad_clip; /* max global gradient norm; 0: none */
    long first_step;  /* the step training starts at (after a resume, the saved one) */
    int resuming;     /* the starting state comes from a checkpoint */
    int pieces_filled; /* the starting weights went straight into the strategy's own
                          pieces (shard_params): a checkpoint, or --init read piece by piece */
    int saves;        /* the run writes checkpoints */
    /* Called before each update, when set: a reader of the state the update
     * writes (a snapshot's copy, train/snapshot_writer.c) is done first. */
    void (*before_update)(void *ctx);
    void *update_ctx;
    /* The data-parallel ranks the job started with, when it may go on
     * with fewer (dtrain launch --min-nproc: DTRAIN_VIRTUAL_WORLD_SIZE);
     * 0 otherwise. The job then keeps vsize blocks of each batch over its
     * size ranks (dt_virtual_blocks). */
    int vsize;
    char err[512];
} dt_rank;

/* What of the model and optimizer a rank holds. The default is everything:
 * parameters, gradients and activations, and optimizer state for the whole
 * flat buffer. A rank that holds no model keeps only the layout (the
 * tensor table); its optimizer state, when it has one, covers floats
 * [opt_lo, opt_hi) of the flat layout. */
typedef struct {
    int model;           /* 1: parameters, gradients, activations; 0: the layout only */
    size_t opt_lo, opt_hi; /* optimizer state range; empty: none */
    /* Or state for several ranges, laid end to end (ZeRO's pieces): used
     * when opt_ranges.n > 0. */
    dt_flat_ranges opt_ranges;
    /* Activation slots, one per micro-batch held at once, each for a part
     * of the model (a pipeline stage's); nslots 0: one of the whole model. */
    int nslots;
    const dt_gpt_part *slots;
} dt_share;

/* What a rank holds by a layer's own arithmetic, for the memory table:
 * the floats of the flat layout whose parameters, gradients and optimizer
 * state it keeps whole (a pipeline stage's; the trainer applies the bytes
 * per float of memory/plan.h), the most of them in use at once (mixed
 * precision widens those into fp32) and whose gradients are open at once
 * (bf16 accumulation adds in fp32 there), and its activation bytes.
 * floats 0 is the whole model, which the ZeRO formulas of memory/plan.h
 * describe (the other figures unused). */
typedef struct {
    size_t floats, in_use, grads_open;
    double acts;
    int copies; /* ranks holding the same floats, over which ZeRO splits the
                   state; 0: the data-parallel blocks (dp_size) */
} dt_rank_mem;

typedef struct dt_strategy_ops {
    const char *name;
    /* Before any plan, for every layer: re-lay the layout (pad segments
     * with dt_gpt_pad_segments), so that the plans see the final offsets.
     * 0, or -1 with r->err. */
    int (*relayout)(void *self, dt_rank *r, dt_gpt *layout);
    /* Before the model exists: what this rank holds, within what the layers
     * above it left (S->held, S->owned: they plan first). layout has the tensor
     * table and the run's modes (precision, mixed, bf16 accumulation,
     * recompute) only; a layer may provide
     * buffers the trainer would otherwise allocate (they stay the layer's,
     * freed by destroy), and hook the model. May be collective. */
    int (*plan)(void *self, dt_rank *r, dt_gpt *layout, dt_share *share);
    /* The model holds its starting weights on the ranks that hold one. */
    int (*start)(void *self, dt_rank *r);

    /* ---- each optimizer step ---- */
    int (*begin_step)(void *self, long step);
    /* Owner: this rank's gradients for the step, from training data
     * position `first`, and the mean loss over its micro-batches. */
    int (*grads)(void *self, uint64_t first, double *loss);
    /* Around each micro-batch's backward (last: the step's last one). */
    void (*before_backward)(void *self, int micro, int last);
    /* After the micro-batches: communication that must finish before the
     * update (the gradients are then final on this rank). */
    int (*end_grads)(void *self);
    /* Owner: the global gradient norm (default: of this rank's gradients). */
    int (*grad_norm)(void *self, double *norm);
    /* Owner: the update (default: the optimizer over this rank's ranges,
     * dt_step_local_update). coef is the clipping coefficient. */
    int (*update)(void *self, double lr, float coef);
    /* After the update, on every layer: what the new values need (ZeRO
     * gathers the updated pieces). */
    int (*after_update)(void *self);
    /* Communication not hidden by compute in the last step, and bytes sent. */
    void (*traffic)(void *self, double *comm_ms, uint64_t *bytes);

    /* ---- around the loop ---- */
    /* Owner: a rank that serves the others instead of training (returns
     * when they are done). */
    int (*serve)(void *self);
    /* Which ranks evaluate, and together: the ranks of *group split the
     * validation batches among them (it starts as the lockstep group). A
     * layer may narrow it, NULL meaning alone (every rank runs every batch:
     * ZeRO-3's gathers need all of its ranks in each forward); NULL from
     * any layer stands. Returns 0 when this rank sits the evaluation out.
     * final: the one at the end. */
    int (*eval_group)(void *self, int final, dt_comm **group);
    /* Owner: the mean loss of one validation batch (default: the model's
     * forward; a pipeline passes it through its stages). */
    int (*eval_loss)(void *self, const int32_t *inputs, const int32_t *targets, int b,
                     double *loss);
    /* After eval_loss, on every layer: the loss of the whole batch from this
     * rank's part (context parallelism averages its rows' means). */
    int (*eval_reduce)(void *self, double *loss);
    /* Before a checkpoint, on every rank (the writer gathers what it needs). */
    int (*before_save)(void *self);
    /* Before the whole parameters are read from the model (the final
     * weights file), on every rank: a layer that does not keep them whole
     * gathers them. */
    int (*gather_params)(void *self);
    /* After the last step, before the final checkpoint and evaluation. */
    int (*end)(void *self);
    /* After the final evaluation: this rank needs its peers no more. */
    int (*release)(void *self);
    /* Whether the ranks' parameters agree: 1 yes, 0 no, < 0 error. */
    int (*replicas_identical)(void *self, uint64_t *hash);
    /* Appends to the trainer's "batch:" line (" x 2 ranks (DDP ...)"). */
    void (*describe)(void *self, FILE *f);
    /* Lines of its own, after every layer's part of the batch line, each
     * started with a newline ("\n  tensor parallel: ..."). */
    void (*describe_lines)(void *self, FILE *f);
    /* A label for rank r in the memory table ("server"), or leaves buf. */
    void (*rank_label)(void *self, int r, char *buf, size_t n);
    /* What rank r holds by this layer's plan (pure arithmetic, any rank's):
     * 1 with *out; 0 when it has none for r (a layer below may answer);
     * -1 when it failed (r->err), so none answers. */
    int (*mem_plan)(void *self, int r, dt_rank_mem *out);
    void (*destroy)(void *self);
} dt_strategy_ops;

typedef struct dt_strategy {
    int nlayers;
    struct {
        const dt_strategy_ops *ops;
        void *self;
    } layer[DT_STRATEGY_MAX_LAYERS];
    dt_rank *rank;
    /* Set by the layers when they are built or planned. */
    dt_comm *lockstep;      /* ranks that share each batch and step together; NULL: alone */
    int dp_index, dp_size;  /* this rank's block of the global batch, and the blocks */
    int dp_hosted;          /* the blocks this rank computes, from dp_index: 1, or more on
                             * rank 0 of a job that shrank (dt_strategy_dp_blocks) */
    int reduce_each_micro;  /* the gradients are reduced after every micro-batch (ZeRO-2),
                             * not once a step: how rank 0 orders the blocks it hosts */
    float *hosted_sum;      /* rank 0 of a shrunk job with accumulation: the sum of the
                             * blocks it computed before the last (step.c) */
    int compute_streams;    /* models computing at once in this process (threads share cores) */
    int block_ranks;        /* ranks that compute each block of the batch together (a
                             * pipeline's stages, a tp x cp group); MFU's peak counts them */
    int writes_checkpoints; /* this rank writes the job's checkpoints */
    int refreshes_params;   /* a layer writes the parameters outside the update (a
                             * parameter-server worker's pull) */
    /* Ranks that each hold the same whole state (plain data parallelism):
     * a snapshot splits its writing among them. NULL: none. */
    dt_comm *replicas;
    int grads_kept_zero;    /* a layer leaves the gradients zero after each step (no memset) */
    /* The ranks whose gradients are summed into each one's (a data-parallel
     * layer's group; the product where layers nest); 1: none. Each rank
     * weighs its tokens' losses by 1 / (the tokens of all of them,
     * dt_strategy_grad_scale) and the layer sums: the mean is then formed
     * before the reduction, as one process forms it over its micro-batches,
     * so a rank-order sum over N ranks gives the bits of one process with N
     * micro-batches whatever N (a division by N after the sum would not). */
    int grad_ranks;
    const dt_flat_ranges *shard; /* the ranges this rank's optimizer state covers; NULL: all */
    const dt_flat_ranges *held;  /* the ranges of the flat layout this rank's model holds
                                  * (a pipeline stage's layers); NULL: all of it */
    float *shard_params;    /* this rank's pieces of the parameters, where no layer keeps them
                             * whole in the model (ZeRO-3), indexed by shard's `at` */
    int defer_update;       /* ZeRO-3 with the optimizer offloaded (--offload-overlap): the
                             * update only begins the store's stream; the layer settles
                             * each piece before it reads it (dt_optimizer_defer_spans) */
    int params_in_store;    /* ZeRO-3's offload_param: those pieces live in the optimizer's
                             * NVMe store (opt->params while mapped), not in shard_params */
    dt_gbuf shard_grads;    /* this rank's pieces of the gradients, where the model's buffer
                             * does not keep them (ZeRO-2), indexed by shard's `at` */
    /* The gradients this rank alone counts in the norm among the ranks of
     * every norm group, `at` as shard's (a pipeline's stage without the
     * tied copy on the last stage, ZeRO's pieces of it); NULL: what it
     * updates. The norm's block sums are summed over each norm group. */
    const dt_flat_ranges *owned;
    dt_comm *norm_group[DT_STRATEGY_MAX_LAYERS];
    int n_norm_groups;
    const dt_flat_ranges *saves; /* what this rank writes of a sharded checkpoint, ranges
                                  * whose `at` index the optimizer's state; NULL: shard */
    dt_comm *save_group;    /* the ranks that write the shards; NULL: lockstep */
    /* A rank whose model holds slices of the tensors (tensor parallelism):
     * the whole model's layout, which checkpoints and weights files are in,
     * and where this rank's flat buffer sits in it (lo, hi: floats of
     * whole's layout, at: of the rank's). whole->params holds the gathered
     * parameters on the writer after gather_params. NULL: the model is whole. */
    dt_gpt *whole;
    const dt_flat_ranges *in_whole;
} dt_strategy;

/* A data-parallel layer over `group` takes its blocks of the global batch
 * (dp_index, dp_size, dp_hosted) and counts them in grad_ranks. A job that
 * shrank (dt_rank.vsize above its size) keeps vsize blocks over the
 * group, which is then the job: see dt_virtual_blocks. */
void dt_strategy_dp_blocks(dt_strategy *S, dt_comm *group);
/* The blocks of a job of `size` ranks that keeps vsize >= size blocks of
 * each batch: rank 0 computes blocks 0 .. vsize - size (*first, *count),
 * rank p > 0 block p + vsize - size. Rank 0 hosts a prefix because a
 * rank-order reduction is a left fold, ((g0 + g1) + g2) + g3: rank 0's
 * (g0 + g1), each block's gradient formed apart as its rank's was, is that
 * fold's first step, and the other ranks' blocks follow in order. */
void dt_virtual_blocks(int rank, int size, int vsize, int *first, int *count);

/* An empty stack (one process) for r. */
void dt_strategy_init(dt_strategy *S, dt_rank *r);
/* Adds a layer on top; self is freed by ops->destroy. Refuses a layer that
 * owns a hook another layer owns already. 0, or -1 with r->err. */
int dt_strategy_add(dt_strategy *S, const dt_strategy_ops *ops, void *self);
/* The names of the layers, "ddp" or "ps-worker+..." ("single" when empty). */
void dt_strategy_name(const dt_strategy *S, char *buf, size_t n);

int dt_strategy_plan(dt_strategy *S, dt_gpt *layout, dt_share *share);
int dt_strategy_start(dt_strategy *S);
/* One optimizer step: gradients of the global batch that begins at
 * training position `first`, the update at learning rate lr. *loss is the
 * mean over the lockstep group, *norm the global gradient norm before
 * clipping. A non-finite norm stops before the update. */
int dt_strategy_step(dt_strategy *S, long step, uint64_t first, double lr, double *loss,
                     double *norm);
void dt_strategy_traffic(dt_strategy *S, double *comm_ms, uint64_t *bytes);
int dt_strategy_serves(const dt_strategy *S);
int dt_strategy_serve(dt_strategy *S);
int dt_strategy_eval_group(dt_strategy *S, int final, dt_comm **group);
int dt_strategy_eval_loss(dt_strategy *S, const int32_t *inputs, const int32_t *targets, int b,
                          double *loss);
int dt_strategy_before_save(dt_strategy *S);
int dt_strategy_gather_params(dt_strategy *S);
int dt_strategy_end(dt_strategy *S);
int dt_strategy_release(dt_strategy *S);
/* 1 agree, 0 not, < 0 error, 2 when no layer compares replicas. */
int dt_strategy_replicas_identical(dt_strategy *S, uint64_t *hash);
void dt_strategy_describe(dt_strategy *S, FILE *f);
/* For a data-parallel layer's describe: " x N ranks (" where its group of
 * n ranks is the batch's blocks, or " x N blocks (n ranks: " where the
 * group also holds ranks that share a block's sequences (context
 * parallelism's). */
void dt_strategy_describe_blocks(const dt_strategy *S, FILE *f, int n);
void dt_strategy_rank_label(dt_strategy *S, int r, char *buf, size_t n);
/* The plan of the topmost layer that has one for rank r: 1 with *out, 0
 * when none has, or -1 with the rank's err when its plan failed. An empty
 * stack (one process) holds the whole model. */
int dt_strategy_mem_plan(dt_strategy *S, int r, dt_rank_mem *out);
void dt_strategy_destroy(dt_strategy *S);

/* The default step pieces, for layers that wrap rather than replace them:
 * this rank's micro-batches through forward and backward (blocks dp_index
 * .. dp_index + dp_hosted - 1 of the global batch); the norm of the
 * gradients it owns (S->owned), their block sums added over the norm
 * groups; the optimizer over the ranges it updates (dt_strategy_updates),
 * then every after_update. */
int dt_step_local_grads(dt_strategy *S, uint64_t first, double *loss);
/* Tells every layer that micro-batch `micro`'s backward comes next (last:
 * the step's last backward on this rank), for a layer that runs the
 * micro-batches itself: DDP starts its reductions from it. */
void dt_strategy_before_backward(dt_strategy *S, int micro, int last);
int dt_step_local_norm(dt_strategy *S, double *norm);
/* The weight of each token's loss in this rank's backward: 1 / (B x rows x
 * micro x grad_ranks), rows being the rows of a sequence the rank's model
 * computes (dt_gpt_rows) and micro the micro-batches it runs a step. */
float dt_strategy_grad_scale(const dt_strategy *S, int B, int rows, int micro);
/* The ranges this rank's optimizer updates: shard, else held, else NULL
 * (the whole layout). */
const dt_flat_ranges *dt_strategy_updates(const dt_strategy *S);
/* Where the parameters and gradients of range q of those sit: the
 * strategy's pieces (by `at`), or the model's buffers (by `lo`). */
float *dt_strategy_params_at(const dt_strategy *S, const dt_flat_range *q);
/* This rank's own pieces of the parameters as memory, indexed by shard's
 * `at`: shard_params, or with params_in_store the optimizer's mapping
 * (NULL unless mapped); NULL where the model holds them in place. */
float *dt_strategy_pieces(const dt_strategy *S);
dt_gbuf dt_strategy_grads_at(const dt_strategy *S, const dt_flat_range *q);
/* A layer's plan narrows what the rank owns: *mine within S->owned, where
 * a layer above set it (*buf, malloc'd, holds the intersection; the caller
 * frees it), then S->owned = mine. 0, or -1 out of memory. */
int dt_strategy_own(dt_strategy *S, dt_flat_ranges *mine, dt_flat_range **buf);
/* Registers a group over which the norm's block sums are added (a layer
 * that splits the gradients among its ranks). 0, or -1 when full. */
int dt_strategy_add_norm_group(dt_strategy *S, dt_comm *group);
int dt_step_local_update(dt_strategy *S, double lr, float coef);

#endif
