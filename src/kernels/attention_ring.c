/*
 * Ring attention's kernels: one query block against one key/value block,
 * forward and backward, the log-sum-exp merge, and where the shards lie.
 * Shapes and the causal rule are in attention_ring.h.
 *
 * Unlike the full-sequence kernels, queries and keys need not start at the
 * same position, so the causal block shapes of attention_blocks.h (made
 * for a diagonal block at equal offsets) do not apply: every product here
 * is a full block, and the mask is applied per row when scores become
 * probabilities, from the positions of the two sub-blocks.
 */
#include "kernels/attention_ring.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/attention_blocks.h"
#include "kernels/attention_slices.h"
#include "kernels/fast_exp.h"
#include "kernels/profile.h"

/* ---- positions ---- */

int dt_seq_shard_check(const char *who, int B, int T, int C, int NH, int N, dt_shard_kind kind,
                       char *err, size_t errlen)
{
    int zz = kind == DT_SHARD_ZIGZAG, m = zz ? 2 * N : N;
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || N <= 0 || C % NH) {
        snprintf(err, errlen, "%s: bad sizes B = %d, T = %d, C = %d, NH = %d (all positive, C "
                 "a multiple of NH)", who, B, T, C, NH);
        return -1;
    }
    if (T % m == 0) return 0;
    int lo = T / m * m, a = lo ? lo : lo + m, b = a + m;
    snprintf(err, errlen, "%s: T = %d is not a multiple of %s = %d (%s sharding over %d ranks); "
             "T = %d or %d would work", who, T, zz ? "2N" : "N", m, zz ? "zig-zag" : "contiguous",
             N, a, b);
    return -1;
}

dt_seq_rows dt_seq_span(int begin, int len)
{
    dt_seq_rows rows = {.count = 1, .begin = {begin, 0}, .len = {len, 0}};
    return rows;
}

int dt_seq_rows_total(const dt_seq_rows *rows)
{
    int total = 0;
    for (int c = 0; c < rows->count; c++) total += rows->len[c];
    return total;
}

int dt_seq_shard(dt_seq_rows *rows, int T, int rank, int N, dt_shard_kind kind)
{
    int chunks = kind == DT_SHARD_ZIGZAG ? 2 * N : N;
    memset(rows, 0, sizeof *rows);
    if (N <= 0 || rank < 0 || rank >= N || T % chunks != 0) return -1;
    int len = T / chunks;
    *rows = dt_seq_span(rank * len, len);
    if (kind == DT_SHARD_ZIGZAG) {
        rows->count = 2;
        rows->begin[1] = (chunks - 1 - rank) * len;
        rows->len[1] = len;
    }
    return 0;
}

int dt_seq_pairs_with_work(const dt_seq_rows *q_rows, const dt_seq_rows *kv_rows)
{
    int pairs = 0;
    for (int i = 0; i < q_rows->count; i++)
        for (int j = 0; j < kv_rows->count; j++)
            pairs += q_rows->len[i] > 0 && kv_rows->len[j] > 0 &&
                     kv_rows->begin[j] <= q_rows->begin[i] + q_rows->len[i] - 1;
    return pairs;
}

/* The query-key pairs of a call as --profile counts them, the way the
 * full-sequence kernels' 2 B T^2 C counts them: each key at or before its
 * query, less half of those at its own position, so that a whole causal
 * sequence gives T^2 / 2, and a rank's share of a ring its share of that. */
static double counted_pairs(const dt_seq_rows *q_rows, const dt_seq_rows *kv_rows)
{
    double pairs = 0.0;
    for (int a = 0; a < q_rows->count; a++)
        for (int c = 0; c < kv_rows->count; c++) {
            int k0 = kv_rows->begin[c], kn = kv_rows->len[c];
            for (int p = q_rows->begin[a]; p < q_rows->begin[a] + q_rows->len[a]; p++) {
                int seen = p - k0 + 1;
                pairs += seen < 0 ? 0 : seen > kn ? kn : seen;
                if (p >= k0 && p < k0 + kn) pairs -= 0.5;
            }
        }
    return pairs;
}

/* ---- sub-blocks: at most ATTN_BLOCK rows, never across a chunk ---- */

typedef struct {
    int chunk, offset; /* where in the dt_seq_rows */
    int row, pos, n;   /* first row of the block, its position, rows */
} sub_block;

/* Steps *b on to the next sub-block (start from a zeroed one); 0 at the end. */
static int sub_block_next(const dt_seq_rows *rows, sub_block *b)
{
    int chunk = b->chunk, offset = b->offset + b->n;
    while (chunk < rows->count && offset >= rows->len[chunk]) chunk++, offset = 0;
    if (chunk >= rows->count) return 0;
    int left = rows->len[chunk] - offset;
    b->row += b->n;
    b->chunk = chunk;
    b->offset = offset;
    b->pos = rows->begin[chunk] + offset;
    b->n = left < ATTN_BLOCK ? left : ATTN_BLOCK;
    return 1;
}

static int keys_after_queries(const sub_block *qb, const sub_block *kb)
{
    return kb->pos > qb->pos + qb->n - 1;
}

/* Keys of kb that query row r of qb sees: a prefix of the sub-block. */
static int visible_keys(const sub_block *qb, const sub_block *kb, int r)
{
    int visible = qb->pos + r - kb->pos + 1;
    return visible < 0 ? 0 : visible > kb->n ? kb->n : visible;
}

/* ---- one (batch, head) slice ---- */

/* What a call's slices share: the inputs and their layout. */
typedef struct {
    const float *q, *k, *v;
    size_t ldq, ldkv;
    const dt_seq_rows *q_rows, *kv_rows;
    int Tq, Tk, C, NH;
    attn_dims kv; /* the key/value block's dims, for packing */
} ring_call;

static ring_call ring_call_make(const float *q, size_t ldq, const float *k, const float *v,
                                size_t ldkv, const dt_seq_rows *q_rows,
                                const dt_seq_rows *kv_rows, int C, int NH)
{
    ring_call r = {q, k, v, ldq, ldkv, q_rows, kv_rows, dt_seq_rows_total(q_rows),
                   dt_seq_rows_total(kv_rows), C, NH, {0}};
    r.kv = attn_make_dims(r.Tk, C, NH);
    r.kv.ld = ldkv;
    return r;
}

typedef struct {
    const float *q, *k, *v; /* the slice's first row of each */
    size_t ldq, ldkv, ldo;  /* ldo: rows of out and dout (C) */
    int Tk;
    attn_dims kv;
} slice;

static slice make_slice(const ring_call *r, int b, int h)
{
    slice x;
    x.kv = r->kv;
    size_t col = (size_t)h * x.kv.HS;
    x.q = r->q + (size_t)b * r->Tq * r->ldq + col;
    x.k = r->k + (size_t)b * r->Tk * r->ldkv + col;
    x.v = r->v + (size_t)b * r->Tk * r->ldkv + col;
    x.ldq = r->ldq, x.ldkv = r->ldkv, x.ldo = (size_t)r->C, x.Tk = r->Tk;
    return x;
}

/* ---- forward ---- */

typedef struct {
    float *kt;     /* [HS, Tk padded]: K transposed */
    float *scores; /* [ATTN_BLOCK, ATTN_BLOCK]: scores, then probabilities */
    float *acc;    /* [ATTN_BLOCK, HS]: unnormalised output of a query sub-block */
    float *m, *l;  /* [ATTN_BLOCK]: running maximum and sum of exp */
} fwd_scratch;

/* The scratch's size, and with a base its pointers (attn_scratch_carve). */
static size_t fwd_scratch_layout(fwd_scratch *s, float *base, const attn_dims *kv)
{
    float **const at[] = {&s->kt, &s->scores, &s->acc, &s->m, &s->l};
    const size_t floats[] = {(size_t)kv->HS * kv->T_padded, ATTN_BLOCK * ATTN_BLOCK,
                             (size_t)ATTN_BLOCK * kv->HS, ATTN_BLOCK, ATTN_BLOCK};
    return attn_scratch_carve(base, at, floats, (int)(sizeof floats / sizeof *floats));
}

/* Folds a block of scores into each row's running softmax
 * (attn_softmax_row), each row seeing the keys its position allows. */
static void online_softmax(const fwd_scratch *s, const sub_block *qb, const sub_block *kb,
                           int HS, float scale)
{
    for (int r = 0; r < qb->n; r++)
        attn_softmax_row(s->scores + r * ATTN_BLOCK, visible_keys(qb, kb, r), scale, &s->m[r],
                         &s->l[r], s->acc + (size_t)r * HS, HS);
}

static void forward_query_block(const fwd_scratch *s, const slice *x, const sub_block *qb,
                                const dt_seq_rows *kv_rows, float *out, float *lse)
{
    int HS = x->kv.HS;
    for (int r = 0; r < qb->n; r++) s->m[r] = -INFINITY, s->l[r] = 0.0f;
    memset(s->acc, 0, (size_t)qb->n * HS * sizeof(float));
    for (sub_block kb = {0}; sub_block_next(kv_rows, &kb);) {
        if (keys_after_queries(qb, &kb)) continue;
        attn_block_gemm(BLOCK_FULL, qb->n, HS, kb.n, x->q + qb->row * x->ldq, x->ldq, 1,
                        s->kt + kb.row, x->kv.T_padded, s->scores, ATTN_BLOCK, 0);
        online_softmax(s, qb, &kb, HS, x->kv.scale);
        attn_block_gemm(BLOCK_FULL, qb->n, kb.n, HS, s->scores, ATTN_BLOCK, 1,
                        x->v + kb.row * x->ldkv, x->ldkv, s->acc, HS, 1);
    }
    for (int r = 0; r < qb->n; r++) {
        float inv_l = s->l[r] > 0.0f ? 1.0f / s->l[r] : 0.0f;
        float *o = out + (qb->row + r) * x->ldo;
        for (int j = 0; j < HS; j++) o[j] = s->acc[(size_t)r * HS + j] * inv_l;
        lse[qb->row + r] = s->l[r] > 0.0f ? s->m[r] + logf(s->l[r]) : -INFINITY;
    }
}

static void forward_slice(const fwd_scratch *s, const slice *x, const dt_seq_rows *q_rows,
                          const dt_seq_rows *kv_rows, float *out, float *lse)
{
    attn_pack_transposed(s->kt, x->k, &x->kv);
    for (sub_block qb = {0}; sub_block_next(q_rows, &qb);)
        forward_query_block(s, x, &qb, kv_rows, out, lse);
}

typedef struct {
    ring_call in;
    float *out, *lse;
} ring_forward;

static float *forward_out(const ring_forward *f, int b, int h)
{
    return f->out + (size_t)b * f->in.Tq * f->in.C + (size_t)h * f->in.kv.HS;
}

static void forward_run(const void *ctx, void *scratch, int b, int h)
{
    const ring_forward *f = ctx;
    fwd_scratch s = {0};
    fwd_scratch_layout(&s, scratch, &f->in.kv);
    slice x = make_slice(&f->in, b, h);
    forward_slice(&s, &x, f->in.q_rows, f->in.kv_rows, forward_out(f, b, h),
                  f->lse + ((size_t)b * f->in.NH + h) * f->in.Tq);
}

static void forward_fail(const void *ctx, int b, int h)
{
    const ring_forward *f = ctx;
    attn_fill_nan(forward_out(f, b, h), (size_t)f->in.C, f->in.Tq, f->in.kv.HS);
}

int dt_attention_block_forward(float *out, float *lse, const float *q, size_t ldq,
                               const float *k, const float *v, size_t ldkv,
                               const dt_seq_rows *q_rows, const dt_seq_rows *kv_rows, int B,
                               int C, int NH)
{
    int pairs = dt_seq_pairs_with_work(q_rows, kv_rows);
    if (pairs == 0 || B <= 0 || C <= 0 || NH <= 0) return pairs;
    const uint64_t t0 = dt_prof_begin();
    ring_forward f = {ring_call_make(q, ldq, k, v, ldkv, q_rows, kv_rows, C, NH), out, lse};
    fwd_scratch sizing; /* the layout names its arrays even when only sizing */
    attn_slices job = {.scratch_bytes = fwd_scratch_layout(&sizing, NULL, &f.in.kv),
                       .run = forward_run, .fail = forward_fail, .ctx = &f,
                       .what = "ring attention forward: out of memory, output set to NaN"};
    attn_run_slices(&job, B, NH);
    const double Tq = f.in.Tq, Tk = f.in.Tk;
    dt_prof_end(DT_PROF_ATTENTION, t0, t0 ? 4.0 * B * C * counted_pairs(q_rows, kv_rows) : 0.0,
                4.0 * B * (C * (2.0 * Tq + 2.0 * Tk) + NH * Tq));
    return pairs;
}

/* ---- merge ---- */

/* log(exp(a) + exp(b)) for finite a and b; log1p of the
 * smaller term keeps precision when one part dominates. */
static float merged_lse(float a, float b)
{
    float hi = a > b ? a : b, lo = a > b ? b : a;
    return hi + log1pf(expf(lo - hi));
}

static void merge_body(float *out, float *lse, const float *part_out,
                       const float *part_lse, int B, int T, int C, int NH)
{
    int HS = NH > 0 ? C / NH : 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                size_t li = ((size_t)b * NH + h) * T + t;
                size_t oi = ((size_t)b * T + t) * C + (size_t)h * HS;
                float a = lse[li], p = part_lse[li];
                if (p == -INFINITY) continue;
                float m = a == -INFINITY ? p : merged_lse(a, p);
                float wa = a == -INFINITY ? 0.0f : expf(a - m), wp = expf(p - m);
                for (int j = 0; j < HS; j++) out[oi + j] = wa * out[oi + j] + wp * part_out[oi + j];
                lse[li] = m;
            }
}

static void row_dots_body(float *D, const float *dout, const float *out, int B, int T,
                          int C, int NH)
{
    int HS = NH > 0 ? C / NH : 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                size_t oi = ((size_t)b * T + t) * C + (size_t)h * HS;
                float sum = 0.0f;
                for (int j = 0; j < HS; j++) sum += dout[oi + j] * out[oi + j];
                D[((size_t)b * NH + h) * T + t] = sum;
            }
}

/* The merge and the row dots count as attention's time and bytes, not its
 * FLOPs: the full-sequence kernels do the same work inside and count only
 * the products. */
void dt_attention_merge(float *out, float *lse, const float *part_out, const float *part_lse,
                        int B, int T, int C, int NH)
{
    const uint64_t t0 = dt_prof_begin();
    merge_body(out, lse, part_out, part_lse, B, T, C, NH);
    dt_prof_end(DT_PROF_ATTENTION, t0, 0.0, 4.0 * B * T * (3.0 * C + 3.0 * NH));
}

void dt_attention_row_dots(float *D, const float *dout, const float *out, int B, int T, int C,
                           int NH)
{
    const uint64_t t0 = dt_prof_begin();
    row_dots_body(D, dout, out, B, T, C, NH);
    dt_prof_end(DT_PROF_ATTENTION, t0, 0.0, 4.0 * B * T * (2.0 * C + NH));
}

/* ---- backward ---- */

typedef struct {
    float *kt, *vt;    /* [HS, Tk padded]: K and V transposed */
    float *probs, *dS; /* [ATTN_BLOCK, ATTN_BLOCK] */
} bwd_scratch;

/* The scratch's size, and with a base its pointers (attn_scratch_carve). */
static size_t bwd_scratch_layout(bwd_scratch *s, float *base, const attn_dims *kv)
{
    float **const at[] = {&s->kt, &s->vt, &s->probs, &s->dS};
    const size_t packed = (size_t)kv->HS * kv->T_padded, block = ATTN_BLOCK * ATTN_BLOCK;
    const size_t floats[] = {packed, packed, block, block};
    return attn_scratch_carve(base, at, floats, (int)(sizeof floats / sizeof *floats));
}

/* The slice's gradients and the per-query terms of backward. */
typedef struct {
    float *dq, *dk, *dv;      /* first row of the slice in each */
    const float *dout;        /* first row of the slice */
    const float *lse, *D;     /* [Tq] */
} slice_grads;

/* scores -> P = exp(scale s - lse), zero for hidden keys. */
static void probabilities(float *p, const float *lse, const sub_block *qb, const sub_block *kb,
                          float scale)
{
    for (int r = 0; r < qb->n; r++) {
        float *row = p + r * ATTN_BLOCK;
        int visible = visible_keys(qb, kb, r);
        float row_lse = lse[qb->row + r];
#pragma omp simd
        for (int j = 0; j < ATTN_BLOCK; j++)
            row[j] = j < visible ? dt_fast_expf(row[j] * scale - row_lse) : 0.0f;
    }
}

/* dP (in dS) -> dS = scale P (dP - D), zero for hidden keys (the scale of
 * dq and dk folded in here). */
static void score_grads(float *dS, const float *p, const float *D, const sub_block *qb,
                        const sub_block *kb, float scale)
{
    for (int r = 0; r < qb->n; r++) {
        float *row = dS + r * ATTN_BLOCK;
        const float *prow = p + r * ATTN_BLOCK;
        int visible = visible_keys(qb, kb, r);
        float row_D = D[qb->row + r];
#pragma omp simd
        for (int j = 0; j < ATTN_BLOCK; j++)
            row[j] = j < visible ? prow[j] * (row[j] - row_D) * scale : 0.0f;
    }
}

static void backward_pair(const bwd_scratch *s, const slice *x, const slice_grads *g,
                          const sub_block *qb, const sub_block *kb)
{
    int HS = x->kv.HS, Tp = x->kv.T_padded;
    const float *q_blk = x->q + qb->row * x->ldq, *dout_blk = g->dout + qb->row * x->ldo;
    size_t kv_off = kb->row * x->ldkv;
    attn_block_gemm(BLOCK_FULL, qb->n, HS, kb->n, q_blk, x->ldq, 1, s->kt + kb->row, Tp,
                    s->probs, ATTN_BLOCK, 0);
    probabilities(s->probs, g->lse, qb, kb, x->kv.scale);
    attn_block_gemm(BLOCK_FULL, kb->n, qb->n, HS, s->probs, 1, ATTN_BLOCK, dout_blk, x->ldo,
                    g->dv + kv_off, x->ldkv, 1);
    attn_block_gemm(BLOCK_FULL, qb->n, HS, kb->n, dout_blk, x->ldo, 1, s->vt + kb->row, Tp,
                    s->dS, ATTN_BLOCK, 0);
    score_grads(s->dS, s->probs, g->D, qb, kb, x->kv.scale);
    attn_block_gemm(BLOCK_FULL, qb->n, kb->n, HS, s->dS, ATTN_BLOCK, 1, x->k + kv_off, x->ldkv,
                    g->dq + qb->row * x->ldq, x->ldq, 1);
    attn_block_gemm(BLOCK_FULL, kb->n, qb->n, HS, s->dS, 1, ATTN_BLOCK, q_blk, x->ldq,
                    g->dk + kv_off, x->ldkv, 1);
}

static void backward_slice(const bwd_scratch *s, const slice *x, const slice_grads *g,
                           const dt_seq_rows *q_rows, const dt_seq_rows *kv_rows)
{
    attn_pack_transposed(s->kt, x->k, &x->kv);
    attn_pack_transposed(s->vt, x->v, &x->kv);
    for (sub_block qb = {0}; sub_block_next(q_rows, &qb);)
        for (sub_block kb = {0}; sub_block_next(kv_rows, &kb);)
            if (!keys_after_queries(&qb, &kb)) backward_pair(s, x, g, &qb, &kb);
}

typedef struct {
    ring_call in;
    float *dq, *dk, *dv;
    const float *dout, *lse, *D;
} ring_backward;

static slice_grads make_grads(const ring_backward *r, const slice *x, int b, int h)
{
    size_t col = (size_t)h * x->kv.HS, head = ((size_t)b * r->in.NH + h) * r->in.Tq;
    slice_grads g = {
        .dq = r->dq + (size_t)b * r->in.Tq * x->ldq + col,
        .dk = r->dk + (size_t)b * x->Tk * x->ldkv + col,
        .dv = r->dv + (size_t)b * x->Tk * x->ldkv + col,
        .dout = r->dout + (size_t)b * r->in.Tq * x->ldo + col,
        .lse = r->lse + head,
        .D = r->D + head,
    };
    return g;
}

static void backward_run(const void *ctx, void *scratch, int b, int h)
{
    const ring_backward *r = ctx;
    bwd_scratch s = {0};
    bwd_scratch_layout(&s, scratch, &r->in.kv);
    slice x = make_slice(&r->in, b, h);
    slice_grads g = make_grads(r, &x, b, h);
    backward_slice(&s, &x, &g, r->in.q_rows, r->in.kv_rows);
}

static void backward_fail(const void *ctx, int b, int h)
{
    const ring_backward *r = ctx;
    slice x = make_slice(&r->in, b, h);
    attn_fill_nan(make_grads(r, &x, b, h).dq, r->in.ldq, r->in.Tq, r->in.kv.HS);
}

int dt_attention_block_backward(float *dq, float *dk, float *dv, const float *dout,
                                const float *lse, const float *D, const float *q, size_t ldq,
                                const float *k, const float *v, size_t ldkv,
                                const dt_seq_rows *q_rows, const dt_seq_rows *kv_rows, int B,
                                int C, int NH)
{
    int pairs = dt_seq_pairs_with_work(q_rows, kv_rows);
    if (pairs == 0 || B <= 0 || C <= 0 || NH <= 0) return pairs;
    const uint64_t t0 = dt_prof_begin();
    ring_backward r = {ring_call_make(q, ldq, k, v, ldkv, q_rows, kv_rows, C, NH),
                       dq, dk, dv, dout, lse, D};
    bwd_scratch sizing; /* the layout names its arrays even when only sizing */
    attn_slices job = {.scratch_bytes = bwd_scratch_layout(&sizing, NULL, &r.in.kv),
                       .run = backward_run, .fail = backward_fail, .ctx = &r,
                       .what = "ring attention backward: out of memory, dq set to NaN"};
    attn_run_slices(&job, B, NH);
    /* q, dout and dq (read and written) a query row; k, v, dk and dv a key */
    const double Tq = r.in.Tq, Tk = r.in.Tk;
    dt_prof_end(DT_PROF_ATTENTION, t0, t0 ? 10.0 * B * C * counted_pairs(q_rows, kv_rows) : 0.0,
                4.0 * B * (C * (4.0 * Tq + 6.0 * Tk) + 2.0 * NH * Tq));
    return pairs;
}
