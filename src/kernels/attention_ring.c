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
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "kernels/attention_blocks.h"
#include "kernels/fast_exp.h"
#include "kernels/threads.h"

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

typedef struct {
    const float *q, *k, *v; /* the slice's first row of each */
    size_t ldq, ldkv, ldo;  /* ldo: rows of out and dout (C) */
    int Tk;
    attn_dims kv;           /* the key/value block's dims, for packing */
} slice;

static slice make_slice(const float *q, size_t ldq, const float *k, const float *v, size_t ldkv,
                        int b, int h, int Tq, int Tk, int C, int NH)
{
    slice x;
    x.kv = attn_make_dims(Tk, C, NH);
    x.kv.ld = ldkv;
    size_t col = (size_t)h * x.kv.HS;
    x.q = q + (size_t)b * Tq * ldq + col;
    x.k = k + (size_t)b * Tk * ldkv + col;
    x.v = v + (size_t)b * Tk * ldkv + col;
    x.ldq = ldq, x.ldkv = ldkv, x.ldo = (size_t)C, x.Tk = Tk;
    return x;
}

/* A thread's scratch, zeroed once: the softmax loops read whole rows of
 * the score blocks, beyond the keys a sub-block has. */
static float *scratch_alloc(size_t floats)
{
    float *base = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    if (base) memset(base, 0, floats * sizeof(float));
    return base;
}

static void fill_nan(float *x, size_t ld, int rows, int HS)
{
    for (int t = 0; t < rows; t++)
        for (int j = 0; j < HS; j++) x[t * ld + j] = NAN;
}

/* ---- forward ---- */

typedef struct {
    float *kt;     /* [HS, Tk padded]: K transposed */
    float *scores; /* [ATTN_BLOCK, ATTN_BLOCK]: scores, then probabilities */
    float *acc;    /* [ATTN_BLOCK, HS]: unnormalised output of a query sub-block */
    float *m, *l;  /* [ATTN_BLOCK]: running maximum and sum of exp */
} fwd_scratch;

static float *fwd_scratch_alloc(fwd_scratch *s, const attn_dims *kv)
{
    size_t kt = (size_t)kv->HS * kv->T_padded, block = ATTN_BLOCK * ATTN_BLOCK;
    float *base = scratch_alloc(kt + block + (size_t)ATTN_BLOCK * kv->HS + 2 * ATTN_BLOCK);
    if (!base) return NULL;
    s->kt = base;
    s->scores = s->kt + kt;
    s->acc = s->scores + block;
    s->m = s->acc + (size_t)ATTN_BLOCK * kv->HS;
    s->l = s->m + ATTN_BLOCK;
    return base;
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

int dt_attention_block_forward(float *out, float *lse, const float *q, size_t ldq,
                               const float *k, const float *v, size_t ldkv,
                               const dt_seq_rows *q_rows, const dt_seq_rows *kv_rows, int B,
                               int C, int NH)
{
    int pairs = dt_seq_pairs_with_work(q_rows, kv_rows);
    int Tq = dt_seq_rows_total(q_rows), Tk = dt_seq_rows_total(kv_rows);
    if (pairs == 0 || B <= 0 || C <= 0 || NH <= 0) return pairs;
    int nt = dt_kernels_threads(), failed = 0;
#pragma omp parallel num_threads(nt) reduction(| : failed)
    {
        fwd_scratch s = {0};
        attn_dims kv = attn_make_dims(Tk, C, NH);
        float *base = fwd_scratch_alloc(&s, &kv);
        failed = base == NULL;
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            slice x = make_slice(q, ldq, k, v, ldkv, b, h, Tq, Tk, C, NH);
            float *o = out + (size_t)b * Tq * C + (size_t)h * kv.HS;
            if (base)
                forward_slice(&s, &x, q_rows, kv_rows, o, lse + (size_t)bh * Tq);
            else
                fill_nan(o, (size_t)C, Tq, kv.HS);
        }
        free(base);
    }
    if (failed) dt_log(DT_LOG_ERROR, "ring attention forward: out of memory, output set to NaN");
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

void dt_attention_merge(float *out, float *lse, const float *part_out, const float *part_lse,
                        int B, int T, int C, int NH)
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

void dt_attention_row_dots(float *D, const float *dout, const float *out, int B, int T, int C,
                           int NH)
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

/* ---- backward ---- */

typedef struct {
    float *kt, *vt;    /* [HS, Tk padded]: K and V transposed */
    float *probs, *dS; /* [ATTN_BLOCK, ATTN_BLOCK] */
} bwd_scratch;

static float *bwd_scratch_alloc(bwd_scratch *s, const attn_dims *kv)
{
    size_t packed = (size_t)kv->HS * kv->T_padded, block = ATTN_BLOCK * ATTN_BLOCK;
    float *base = scratch_alloc(2 * packed + 2 * block);
    if (!base) return NULL;
    s->kt = base;
    s->vt = s->kt + packed;
    s->probs = s->vt + packed;
    s->dS = s->probs + block;
    return base;
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

static slice_grads make_grads(float *dq, float *dk, float *dv, const float *dout,
                              const float *lse, const float *D, const slice *x, int b, int h,
                              int Tq, int NH)
{
    size_t col = (size_t)h * x->kv.HS, head = ((size_t)b * NH + h) * Tq;
    slice_grads g = {
        .dq = dq + (size_t)b * Tq * x->ldq + col,
        .dk = dk + (size_t)b * x->Tk * x->ldkv + col,
        .dv = dv + (size_t)b * x->Tk * x->ldkv + col,
        .dout = dout + (size_t)b * Tq * x->ldo + col,
        .lse = lse + head,
        .D = D + head,
    };
    return g;
}

int dt_attention_block_backward(float *dq, float *dk, float *dv, const float *dout,
                                const float *lse, const float *D, const float *q, size_t ldq,
                                const float *k, const float *v, size_t ldkv,
                                const dt_seq_rows *q_rows, const dt_seq_rows *kv_rows, int B,
                                int C, int NH)
{
    int pairs = dt_seq_pairs_with_work(q_rows, kv_rows);
    int Tq = dt_seq_rows_total(q_rows), Tk = dt_seq_rows_total(kv_rows);
    if (pairs == 0 || B <= 0 || C <= 0 || NH <= 0) return pairs;
    int nt = dt_kernels_threads(), failed = 0;
#pragma omp parallel num_threads(nt) reduction(| : failed)
    {
        bwd_scratch s = {0};
        attn_dims kv = attn_make_dims(Tk, C, NH);
        float *base = bwd_scratch_alloc(&s, &kv);
        failed = base == NULL;
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            slice x = make_slice(q, ldq, k, v, ldkv, b, h, Tq, Tk, C, NH);
            slice_grads g = make_grads(dq, dk, dv, dout, lse, D, &x, b, h, Tq, NH);
            if (base)
                backward_slice(&s, &x, &g, q_rows, kv_rows);
            else
                fill_nan(g.dq, ldq, Tq, kv.HS);
        }
        free(base);
    }
    if (failed) dt_log(DT_LOG_ERROR, "ring attention backward: out of memory, dq set to NaN");
    return pairs;
}
