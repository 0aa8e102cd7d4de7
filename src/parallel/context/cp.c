/* Context parallelism as a strategy layer. See cp.h. */
#include "parallel/context/cp.h"

#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "parallel/context/ring_attention.h"
#include "parallel/context/ulysses.h"
#include "parallel/tensor/tp.h"

typedef struct {
    dt_strategy *S;
    dt_comm *cp; /* the mesh's cp_group */
    int me, size, ulysses;
    int tp;     /* the tensor-parallel ranks that split each layer's heads */
    int copies; /* ranks that hold the same parameters: cp x dp */
    dt_gpt *m;
    /* The attention of the sizes last seen (init communicates nothing, so
     * a change of sizes, an evaluation's batch, costs nothing). */
    dt_ring_attention ring;
    dt_ulysses uly;
    int b, t, A, NH;
    uint64_t bytes0; /* the group's transport counter at the step's start */
} cp_layer;

/* Fits the attention to the layer's sizes; 0, or -1 with its message. */
static int ready(cp_layer *L, int b, int t, int A, int NH, char *err, size_t n)
{
    if (L->b == b && L->t == t && L->A == A && L->NH == NH) return 0;
    L->b = 0;
    int rc = L->ulysses ? dt_ulysses_init(&L->uly, L->cp, b, t, A, NH, DT_SHARD_CONTIGUOUS)
                        : dt_ring_attention_init(&L->ring, L->cp, b, t, A, NH, DT_SHARD_ZIGZAG);
    if (rc) return dt_strf(err, n, "%s", L->ulysses ? L->uly.error : L->ring.error), -1;
    L->b = b, L->t = t, L->A = A, L->NH = NH;
    return 0;
}

static int attn_forward(void *ctx, float *out, float *saved, const float *qkv, int b, int t,
                        int A, int NH, char *err, size_t n)
{
    cp_layer *L = ctx;
    if (ready(L, b, t, A, NH, err, n)) return -1;
    int rc = L->ulysses ? dt_ulysses_forward(&L->uly, out, qkv, saved)
                        : dt_ring_attention_forward(&L->ring, out, saved, qkv);
    if (rc) return dt_strf(err, n, "%s", L->ulysses ? L->uly.error : L->ring.error), -1;
    return 0;
}

static int attn_backward(void *ctx, float *dqkv, const float *dout, const float *qkv,
                         const float *out, const float *saved, int b, int t, int A, int NH,
                         char *err, size_t n)
{
    cp_layer *L = ctx;
    if (ready(L, b, t, A, NH, err, n)) return -1;
    int rc = L->ulysses ? dt_ulysses_backward(&L->uly, dqkv, dout, saved)
                        : dt_ring_attention_backward(&L->ring, dqkv, dout, qkv, out, saved);
    if (rc) return dt_strf(err, n, "%s", L->ulysses ? L->uly.error : L->ring.error), -1;
    return 0;
}

/* Ulysses keeps its head-sharded q, k, v and output (4 A a row) with the
 * lse; ring attention keeps the lse alone. */
void dt_cp_algo_shape(const char *algo, dt_shard_kind *kind, int *saved_widths)
{
    int ulysses = algo && strcmp(algo, "ulysses") == 0;
    *kind = ulysses ? DT_SHARD_CONTIGUOUS : DT_SHARD_ZIGZAG;
    *saved_widths = ulysses ? 4 : 0;
}

/* Sizes that do not split are refused before any step, on every rank
 * alike, naming what would work. */
static int check_sizes(cp_layer *L, dt_rank *r, const dt_gpt *layout)
{
    const int NH = layout->cfg.n_head / L->tp, C = layout->cfg.n_embd / L->tp;
    char who[48], ok[128];
    snprintf(who, sizeof who, "--cp %d --cp-algo %s", L->size, L->ulysses ? "ulysses" : "ring");
    if (L->ulysses && NH % L->size) {
        dt_str_divisors(ok, sizeof ok, NH);
        return dt_strf(r->err, sizeof r->err, "%s: Ulysses gives each rank whole heads, and "
                       "the %d heads%s do not split into %d; --cp %s would, or --cp-algo ring",
                       who, NH, L->tp > 1 ? " of a tensor-parallel rank" : "", L->size, ok), -1;
    }
    return dt_seq_shard_check(who, r->B, r->T, C, NH, L->size,
                              L->ulysses ? DT_SHARD_CONTIGUOUS : DT_SHARD_ZIGZAG, r->err,
                              sizeof r->err);
}

/* The model's gather over the group (a mixture of experts' routing). */
static int model_gather(void *ctx, const void *send, void *recv, size_t bytes, char *err,
                        size_t errlen)
{
    cp_layer *L = ctx;
    if (dt_allgather(L->cp, send, recv, bytes, DT_U8) == 0) return 0;
    return dt_strf(err, errlen, "all-gather over the context-parallel group: %s",
                   dt_comm_error(L->cp)), -1;
}

static int cp_relayout(void *self, dt_rank *r, dt_gpt *layout)
{
    cp_layer *L = self;
    if (check_sizes(L, r, layout)) return -1;
    dt_shard_kind kind;
    int widths;
    dt_cp_algo_shape(L->ulysses ? "ulysses" : "ring", &kind, &widths);
    if (dt_gpt_set_cp(layout, L->me, L->size, kind, widths))
        return dt_strf(r->err, sizeof r->err, "%s", layout->error), -1;
    layout->cp.forward = attn_forward;
    layout->cp.backward = attn_backward;
    layout->cp.gather = model_gather;
    layout->cp.ctx = L;
    L->m = layout;
    return 0;
}

static int cp_begin_step(void *self, long step)
{
    cp_layer *L = self;
    (void)step;
    L->bytes0 = dt_comm_bytes_sent(L->cp);
    return 0;
}

/* Bytes only: the exchange runs inside attention (the ring's overlapped
 * with its blocks), so its time is counted as the model's. */
static void cp_traffic(void *self, double *comm_ms, uint64_t *bytes)
{
    cp_layer *L = self;
    (void)comm_ms;
    *bytes += dt_comm_bytes_sent(L->cp) - L->bytes0;
}

/* A batch's loss is the mean over all its tokens: the group's rows'
 * means, averaged (every rank holds as many rows). */
static int cp_eval_reduce(void *self, double *loss)
{
    cp_layer *L = self;
    dt_rank *r = L->S->rank;
    double l = *loss;
    if (dt_allreduce(L->cp, &l, &l, 1, DT_F64, DT_SUM))
        return dt_strf(r->err, sizeof r->err, "context parallelism: evaluation: %s",
                       dt_comm_error(L->cp)), -1;
    *loss = l / L->size;
    return 0;
}

static void cp_describe(void *self, FILE *f)
{
    cp_layer *L = self;
    const dt_gpt_cp *c = &L->m->cp;
    dt_seq_rows rows;
    dt_seq_shard(&rows, L->S->rank->T, L->me, L->size, c->kind);
    fprintf(f, "\n  context parallel: %d ranks per group (%s), %s attention, %s sequence "
            "chunks; this rank positions [%d, %d)", L->size, dt_comm_transport(L->cp),
            L->ulysses ? "Ulysses (all-to-all to heads)" : "ring", L->ulysses ? "contiguous"
            : "zig-zag", rows.begin[0], rows.begin[0] + rows.len[0]);
    if (rows.count > 1)
        fprintf(f, " and [%d, %d)", rows.begin[1], rows.begin[1] + rows.len[1]);
}

/* Every rank of the group holds the whole model and its rows' share of the
 * activations; a tensor-parallel layer above says more where there is one. */
static int cp_mem_plan(void *self, int q, dt_rank_mem *out)
{
    cp_layer *L = self;
    dt_rank *r = L->S->rank;
    (void)q;
    if (dt_tp_rank_mem(L->m, 0, 1, r->B, r->T, out, r->err, sizeof r->err)) return -1;
    out->copies = L->copies;
    return 1;
}

static void cp_destroy(void *self) { free(self); }

static const dt_strategy_ops cp_ops = {
    .name = "cp",
    .relayout = cp_relayout,
    .begin_step = cp_begin_step,
    .traffic = cp_traffic,
    .eval_reduce = cp_eval_reduce,
    .describe_lines = cp_describe,
    .mem_plan = cp_mem_plan,
    .destroy = cp_destroy,
};

int dt_cp_layer(dt_strategy *S, const dt_mesh *g, const dt_parallel_opts *o)
{
    dt_rank *r = S->rank;
    cp_layer *L = calloc(1, sizeof *L);
    if (!L) return dt_strf(r->err, sizeof r->err, "context parallelism: out of memory"), -1;
    L->S = S;
    L->cp = g->cp_group;
    L->me = g->cp_i;
    L->size = g->cp;
    L->tp = g->tp;
    L->copies = g->cp * g->dp;
    L->ulysses = o->cp_algo && strcmp(o->cp_algo, "ulysses") == 0;
    return dt_strategy_add(S, &cp_ops, L);
}
