/* Tensor parallelism as a strategy layer. See tp.h. */
#include "parallel/tensor/tp.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/hash.h"
#include "core/str.h"
#include "core/timer.h"
#include "parallel/fingerprint.h"
#include "parallel/mesh.h"
#include "parallel/slices.h"

typedef struct {
    dt_strategy *S;
    dt_comm *tp;      /* the mesh's tp_group */
    int me, size;
    int gathers;      /* the writer's group (rank 0's): gathers the whole parameters */
    int replicated;   /* other groups hold the same slices */
    int copies;       /* ranks that hold each slice: cp x dp */
    int sp;           /* sequence parallelism */
    dt_gpt *m;        /* the rank's layout, from relayout on */
    dt_gpt whole;     /* the whole model's layout; parameters on the writer, gathered */
    dt_flat_range *map, *own, *own_within, all;
    dt_flat_ranges in_whole, owned, saves;
    uint64_t bytes0;  /* the group's transport counter at the step's start */
    double ms;        /* in the model's reduces, in the last step */
} tp_layer;

static int failed(tp_layer *L, const char *what, dt_comm *c)
{
    dt_rank *r = L->S->rank;
    return dt_strf(r->err, sizeof r->err, "tensor parallelism: %s: %s", what,
                   c ? dt_comm_error(c) : "out of memory"), -1;
}

int dt_tp_reduce(void *comm, void *buf, size_t n, dt_tp_op op, char *err, size_t errlen)
{
    dt_comm *c = comm;
    const size_t part = n / (size_t)dt_comm_size(c);
    const char *what = "all-reduce";
    int rc;
    if (op == DT_TP_GATHER_F32) {
        what = "all-gather";
        rc = dt_allgather(c, buf, buf, part, DT_F32);
    } else if (op == DT_TP_SCATTER_SUM_F32) {
        what = "reduce-scatter";
        rc = dt_reduce_scatter(c, buf, buf, part, DT_F32, DT_SUM);
    } else {
        rc = dt_allreduce(c, buf, buf, n, op == DT_TP_SUM_F64 ? DT_F64 : DT_F32,
                          op == DT_TP_MAX_F32 ? DT_MAX : DT_SUM);
    }
    if (rc == 0) return 0;
    return dt_strf(err, errlen, "%s over the tensor-parallel group: %s", what,
                   dt_comm_error(c)), -1;
}

/* The model's reduce, timed: it waits for its result, so all of it is
 * exposed. */
static int model_reduce(void *ctx, void *buf, size_t n, dt_tp_op op, char *err, size_t errlen)
{
    tp_layer *L = ctx;
    uint64_t t0 = dt_now_ns();
    int rc = dt_tp_reduce(L->tp, buf, n, op, err, errlen);
    L->ms += (double)(dt_now_ns() - t0) * 1e-6;
    return rc;
}

static int tp_relayout(void *self, dt_rank *r, dt_gpt *layout)
{
    tp_layer *L = self;
    if (dt_gpt_set_tp(layout, L->me, L->size))
        return dt_strf(r->err, sizeof r->err, "%s", layout->error), -1;
    layout->tp.sp = L->sp;
    layout->tp.reduce = model_reduce;
    layout->tp.ctx = L;
    return 0;
}

/* What this rank alone counts in the norm and writes of a checkpoint: its
 * slices, and on the group's first rank the whole tensors too (every rank
 * holds their same bits), within what a layer above owns. */
static int is_split(const dt_param_tensor *t) { return t->split; }
static int is_whole(const dt_param_tensor *t) { return !t->split; }

static int plan_owned(tp_layer *L)
{
    const dt_gpt *m = L->m;
    int n = 0;
    if (!(L->own = malloc((size_t)(m->n_tensors + 1) * sizeof *L->own))) return -1;
    if (L->me == 0) L->own[n++] = (dt_flat_range){0, m->n_floats, 0};
    else n = dt_slices_ranges(m, is_split, L->own);
    L->owned = (dt_flat_ranges){n, L->own, m->n_floats};
    return dt_strategy_own(L->S, &L->owned, &L->own_within);
}

static int tp_plan(void *self, dt_rank *r, dt_gpt *layout, dt_share *share)
{
    tp_layer *L = self;
    (void)share;
    L->m = layout;
    if (dt_gpt_create_layout(&L->whole, &layout->cfg, layout->prec, r->err, sizeof r->err))
        return -1;
    int n = dt_gpt_tp_ranges(layout, &L->whole, NULL, 0);
    if (!(L->map = malloc((size_t)n * sizeof *L->map)) || plan_owned(L))
        return failed(L, "planning", NULL);
    dt_gpt_tp_ranges(layout, &L->whole, L->map, n);
    L->in_whole = (dt_flat_ranges){n, L->map, layout->n_floats};
    L->S->whole = &L->whole;
    L->S->in_whole = &L->in_whole;
    return 0;
}

static int tp_begin_step(void *self, long step)
{
    tp_layer *L = self;
    (void)step;
    L->bytes0 = dt_comm_bytes_sent(L->tp);
    L->ms = 0;
    return 0;
}

static void tp_traffic(void *self, double *comm_ms, uint64_t *bytes)
{
    tp_layer *L = self;
    *comm_ms += L->ms;
    *bytes += dt_comm_bytes_sent(L->tp) - L->bytes0; /* the norm's sums too */
}

/* A slice's parameters (local, in lay's layout) into the whole ones. */
static int place_slice(tp_layer *L, const dt_gpt *lay, const float *local)
{
    return dt_slices_place(lay, &L->whole, local) ? failed(L, "gathering the parameters", NULL)
                                                   : 0;
}

/* Rank q's parameters received and placed (on the writer). */
static int receive_slice(tp_layer *L, int q)
{
    dt_gpt lay;
    dt_rank *r = L->S->rank;
    if (dt_gpt_peer_layout(L->m, q, L->size, &lay, r->err, sizeof r->err)) return -1;
    float *buf = malloc(lay.n_floats * sizeof(float));
    int rc = !buf ? failed(L, "gathering the parameters", NULL)
             : dt_recv(L->tp, buf, lay.n_floats, DT_F32, q)
                 ? failed(L, "gathering the parameters", L->tp)
                 : place_slice(L, &lay, buf);
    free(buf);
    dt_gpt_destroy(&lay);
    return rc;
}

/* The whole parameters on the writer (rank 0), from every slice of its
 * group (each whole in its own layout by now: the layers below gathered
 * their parts). */
static int tp_gather_params(void *self)
{
    tp_layer *L = self;
    const dt_gpt *m = L->m;
    if (!L->gathers) return 0;
    if (L->me != 0)
        return dt_send(L->tp, m->params, m->n_floats, DT_F32, 0)
                   ? failed(L, "gathering the parameters", L->tp) : 0;
    if (!L->whole.params && dt_gpt_alloc_params(&L->whole))
        return failed(L, "the whole parameters", NULL);
    if (place_slice(L, m, m->params)) return -1;
    for (int q = 1; q < L->size; q++)
        if (receive_slice(L, q)) return -1;
    return 0;
}

/* The whole tensors are the same bits on every rank of the group: the
 * reduces must give every rank the same sums. */
static int tp_replicas(void *self, uint64_t *hash)
{
    tp_layer *L = self;
    const uint64_t h = dt_slices_hash(L->m, is_whole);
    int64_t lo = (int64_t)h, hi = (int64_t)h;
    int same = dt_fingerprints_agree(L->tp, &lo, &hi, 1);
    if (same < 0) return failed(L, "comparing the whole tensors", L->tp);
    if (!L->replicated && hash) *hash = h;
    return same;
}

static void tp_describe(void *self, FILE *f)
{
    tp_layer *L = self;
    const dt_gpt_tp *t = &L->m->tp;
    fprintf(f, "\n  tensor parallel: %d ranks per group (%s), this rank %d heads of %d, %d of %d "
            "MLP columns, vocabulary rows [%d, %d)", L->size, dt_comm_transport(L->tp), t->heads,
            L->m->cfg.n_head, t->mlp, 4 * L->m->cfg.n_embd, t->v0, t->v0 + t->vocab);
}

int dt_tp_rank_mem(const dt_gpt *layout, int q, int tp, int B, int T, dt_rank_mem *out,
                   char *err, size_t errlen)
{
    dt_gpt lay;
    if (dt_gpt_peer_layout(layout, q, tp, &lay, err, errlen)) return -1;
    dt_places_layout_mem(&lay, B, T, out);
    dt_gpt_destroy(&lay);
    return 0;
}

/* A rank's slices, where no layer below holds a part of them (a pipeline
 * stage's layers: its plan is the finer one). */
static int tp_mem_plan(void *self, int q, dt_rank_mem *out)
{
    tp_layer *L = self;
    dt_rank *r = L->S->rank;
    if (L->S->held) return 0;
    if (dt_tp_rank_mem(L->m, q % L->size, L->size, r->B, r->T, out, r->err, sizeof r->err))
        return -1;
    out->copies = L->copies;
    return 1;
}

static void tp_destroy(void *self)
{
    tp_layer *L = self;
    if (L->whole.tensors) dt_gpt_destroy(&L->whole);
    free(L->map);
    free(L->own);
    free(L->own_within);
    free(L);
}

static const dt_strategy_ops tp_ops = {
    .name = "tp",
    .relayout = tp_relayout,
    .plan = tp_plan,
    .begin_step = tp_begin_step,
    .traffic = tp_traffic,
    .gather_params = tp_gather_params,
    .replicas_identical = tp_replicas,
    .describe_lines = tp_describe,
    .mem_plan = tp_mem_plan,
    .destroy = tp_destroy,
};

int dt_tp_layer(dt_strategy *S, const dt_mesh *g, int sp)
{
    dt_rank *r = S->rank;
    tp_layer *L = calloc(1, sizeof *L);
    if (!L) return dt_strf(r->err, sizeof r->err, "tensor parallelism: out of memory"), -1;
    L->S = S;
    L->tp = g->tp_group;
    L->me = g->tp_i;
    L->size = g->tp;
    /* With expert parallelism its layer brings the slices with the experts. */
    L->gathers = g->cp_i == 0 && g->dp_i == 0 && g->pp_i == 0 && g->ep == 1;
    L->replicated = g->replicas != NULL;
    L->copies = g->cp * g->dp;
    L->sp = sp;
    if (dt_strategy_add_norm_group(S, L->tp))
        return tp_destroy(L), dt_strf(r->err, sizeof r->err, "tensor parallelism: too many "
                                      "layers"), -1;
    return dt_strategy_add(S, &tp_ops, L);
}
