/* Pipeline schedules: the five orders of compute per rank, the messages
 * around them, and the closed bubble formulas. See schedule.h. */
#include "parallel/pipeline/schedule.h"

#include <stdlib.h>
#include <string.h>

#include "core/str.h"

static const char *const kind_names[] = {"naive", "gpipe", "1f1b", "interleaved", "zb1p"};
#define N_KINDS ((int)(sizeof kind_names / sizeof kind_names[0]))

int dt_pp_kind_parse(const char *name, dt_pp_kind *out)
{
    for (int k = 0; k < N_KINDS; k++)
        if (!strcmp(name, kind_names[k])) return *out = (dt_pp_kind)k, 0;
    return -1;
}

const char *dt_pp_kind_name(dt_pp_kind k)
{
    return (int)k >= 0 && (int)k < N_KINDS ? kind_names[k] : "?";
}

int dt_pp_schedule_valid(dt_pp_kind kind, int p, int V, int M, char *err, size_t errlen)
{
    if ((int)kind < 0 || (int)kind >= N_KINDS)
        return dt_strf(err, errlen, "unknown pipeline schedule %d", (int)kind), -1;
    const char *name = kind_names[kind];
    if (p < 2 || p > 64)
        return dt_strf(err, errlen, "pipeline schedule %s: %d pipeline ranks; a pipeline needs "
                       "2 to 64 (one rank needs no pipeline)", name, p), -1;
    if (M < 1)
        return dt_strf(err, errlen, "pipeline schedule %s: %d micro-batches; give at least 1 "
                       "(at least %d keeps all %d ranks busy at once)", name, M, p, p), -1;
    if (kind != DT_PP_INTERLEAVED && V != 1)
        return dt_strf(err, errlen, "pipeline schedule %s: %d virtual stages per rank; only "
                       "interleaved splits a rank's layers into chunks, use V = 1 or "
                       "interleaved", name, V), -1;
    if (kind == DT_PP_INTERLEAVED && V < 2)
        return dt_strf(err, errlen, "pipeline schedule interleaved: %d virtual stages per rank; "
                       "it needs at least 2 (with 1, use 1f1b)", V), -1;
    if (kind == DT_PP_INTERLEAVED && M % p)
        return dt_strf(err, errlen, "pipeline schedule interleaved: %d micro-batches is not a "
                       "multiple of p = %d (micro-batches go through the chunks in groups of "
                       "p); use a multiple of %d such as %d, or 1f1b", M, p, p,
                       (M / p + 1) * p), -1;
    if ((long)p * V > 32767)
        return dt_strf(err, errlen, "pipeline schedule %s: %d x %d stages do not fit the "
                       "schedule's 16-bit stage numbers; use fewer chunks", name, p, V), -1;
    if ((long)M * V > 1L << 20)
        return dt_strf(err, errlen, "pipeline schedule %s: %d micro-batches x %d chunks is "
                       "more than 2^20 actions a rank", name, M, V), -1;
    return 0;
}

/* One rank's compute actions, before the messages go in. */
typedef struct {
    dt_pp_action *a;
    int n;
} plan;

static void put(plan *q, dt_pp_op op, int stage, int micro)
{
    q->a[q->n++] = (dt_pp_action){(uint8_t)op, (int16_t)stage, micro, -1};
}

static void order_naive(plan *q, int r, int M)
{
    for (int i = 0; i < M; i++) {
        put(q, DT_PP_F, r, i);
        put(q, DT_PP_B, r, i);
    }
}

/* Backwards in micro-batch order, as PyTorch's ScheduleGPipe runs them: the
 * bubble is the same as in the reverse order GPipe is often drawn with, and
 * each stage's gradients add up in the order one process adds them. */
static void order_gpipe(plan *q, int r, int M)
{
    for (int i = 0; i < M; i++) put(q, DT_PP_F, r, i);
    for (int i = 0; i < M; i++) put(q, DT_PP_B, r, i);
}

/* Megatron's numbering of a rank's k-th forward (or backward) among its
 * M * V: groups of p micro-batches sweep the chunks in turn, forwards
 * through chunks 0 .. V-1, backwards through V-1 .. 0. With V = 1 it is
 * micro-batch k on stage r. */
static void put_virtual(plan *q, dt_pp_op op, int r, int p, int V, int k)
{
    int chunk = k % (p * V) / p, micro = k / (p * V) * p + k % p;
    if (op != DT_PP_F) chunk = V - 1 - chunk;
    put(q, op, chunk * p + r, micro);
}

/* w forwards, then forward and backward in turn, then the backwards left. */
static void order_1f1b_like(plan *q, int r, int p, int V, int M, int w)
{
    const int total = M * V;
    if (w > total) w = total;
    for (int k = 0; k < w; k++) put_virtual(q, DT_PP_F, r, p, V, k);
    for (int k = 0; k < total - w; k++) {
        put_virtual(q, DT_PP_F, r, p, V, k + w);
        put_virtual(q, DT_PP_B, r, p, V, k);
    }
    for (int k = total - w; k < total; k++) put_virtual(q, DT_PP_B, r, p, V, k);
}

/* ZB-H1: 1F1B's forwards, with each backward split into I then W. After
 * rank r's last I the gradient still has r ranks to pass on its way to
 * rank 0; rank r runs each W r micro-batches late, so that r W's are left
 * for the very end, where they fill that time, which 1F1B's cool-down
 * spends idle. The W's keep micro-batch order, so the weights' gradients
 * add up in the order one process adds them. Between F and I a rank holds
 * what 1F1B holds, min(M, p-r) micro-batches; between F and W at most p. */
static void order_zb1p(plan *q, int r, int p, int M)
{
    const int w = M < p - r ? M : p - r, defer = M < r ? M : r;
    int nf = 0;
    while (nf < w) put(q, DT_PP_F, r, nf++);
    for (int j = 0; j < M; j++) {
        put(q, DT_PP_I, r, j);
        if (j >= defer) put(q, DT_PP_W, r, j - defer);
        if (nf < M) put(q, DT_PP_F, r, nf++);
    }
    for (int j = M - defer; j < M; j++) put(q, DT_PP_W, r, j);
}

static void fill_orders(plan *q, dt_pp_kind kind, int p, int V, int M)
{
    for (int r = 0; r < p; r++) {
        if (kind == DT_PP_NAIVE) order_naive(&q[r], r, M);
        if (kind == DT_PP_GPIPE) order_gpipe(&q[r], r, M);
        if (kind == DT_PP_1F1B) order_1f1b_like(&q[r], r, p, 1, M, p - r - 1);
        if (kind == DT_PP_ZB1P) order_zb1p(&q[r], r, p, M);
        if (kind == DT_PP_INTERLEAVED)
            order_1f1b_like(&q[r], r, p, V, M, (p - r - 1) * 2 + (V - 1) * p);
    }
}

/* The messages around each compute action: a receive just before the
 * compute that needs it, a send right after the compute that produced it,
 * so an executor can overlap both with the compute in between. */
static int add_messages(dt_pp_schedule *s, int r, const plan *q)
{
    const int S = s->p * s->V;
    dt_pp_action *out = malloc((size_t)q->n * 3 * sizeof *out);
    if (!out) return -1;
    int n = 0;
    for (int j = 0; j < q->n; j++) {
        dt_pp_action a = q->a[j];
        int k = a.stage, fwd = a.op == DT_PP_F, bwd = a.op == DT_PP_B || a.op == DT_PP_I;
        dt_pp_action m = {0, a.stage, a.micro, 0};
        if (fwd && k > 0) m.op = DT_PP_RECV_F, m.peer = (int16_t)((k - 1) % s->p), out[n++] = m;
        if (bwd && k < S - 1) m.op = DT_PP_RECV_B, m.peer = (int16_t)((k + 1) % s->p), out[n++] = m;
        out[n++] = a;
        if (fwd && k < S - 1) m.op = DT_PP_SEND_F, m.peer = (int16_t)((k + 1) % s->p), out[n++] = m;
        if (bwd && k > 0) m.op = DT_PP_SEND_B, m.peer = (int16_t)((k - 1) % s->p), out[n++] = m;
    }
    s->acts[r] = out;
    s->n[r] = n;
    return 0;
}

static int build_lists(dt_pp_schedule *s)
{
    plan *q = calloc((size_t)s->p, sizeof *q);
    int rc = q ? 0 : -1;
    for (int r = 0; !rc && r < s->p; r++)
        rc = (q[r].a = malloc((size_t)s->M * s->V * 3 * sizeof *q[r].a)) ? 0 : -1;
    if (!rc) fill_orders(q, s->kind, s->p, s->V, s->M);
    for (int r = 0; !rc && r < s->p; r++) rc = add_messages(s, r, &q[r]);
    for (int r = 0; q && r < s->p; r++) free(q[r].a);
    free(q);
    return rc;
}

int dt_pp_schedule_build(dt_pp_schedule *s, dt_pp_kind kind, int p, int V, int M, char *err,
                         size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (dt_pp_schedule_valid(kind, p, V, M, err, errlen)) return -1;
    *s = (dt_pp_schedule){kind, p, V, M, calloc((size_t)p, sizeof(int)),
                          calloc((size_t)p, sizeof(dt_pp_action *))};
    if (!s->n || !s->acts || build_lists(s)) {
        dt_pp_schedule_free(s);
        return dt_strf(err, errlen, "pipeline schedule %s: out of memory (p = %d, V = %d, M = %d)",
                       kind_names[kind], p, V, M), -1;
    }
    return 0;
}

void dt_pp_schedule_free(dt_pp_schedule *s)
{
    for (int r = 0; s->acts && r < s->p; r++) free(s->acts[r]);
    free(s->acts);
    free(s->n);
    memset(s, 0, sizeof *s);
}

double dt_pp_bubble_formula(dt_pp_kind kind, int p, int V, int M)
{
    double x;
    switch (kind) {
    case DT_PP_NAIVE: return (double)(p - 1) / p;
    case DT_PP_GPIPE:
    case DT_PP_1F1B: return (double)(p - 1) / (M + p - 1);
    case DT_PP_INTERLEAVED: x = (double)(p - 1) / ((double)V * M); break;
    case DT_PP_ZB1P: x = (double)(p - 1) / (3.0 * M); break;
    default: return 0;
    }
    return x / (1 + x);
}
