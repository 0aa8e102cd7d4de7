/*
 * Causal self-attention, backward, flash style: no T x T matrix is kept.
 *   qkv, dqkv [B, T, 3C]; out, dout [B, T, C]; lse [B, NH, T]
 * Per (batch, head) slice, for each key block and each query block at or
 * after it, the probabilities are recomputed from the saved log-sum-exp,
 * P = exp(scale * q.k - lse), and with D = rowsum(dout * out):
 *   dV += P^T dO,  dP = dO V^T,  dS = P (dP - D) scale,
 *   dQ += dS K,    dK += dS^T Q.
 * dK and dV of a key block gather in scratch and are written once; dQ adds
 * up in dqkv itself, where the first key block (which every query block
 * sees) writes it, so that it needs no zeroing pass first. A slice belongs
 * to one thread (attention_slices.h), so nothing is shared.
 * With AVX-512 or AVX2 + FMA, P and dS are formed a register tile of
 * query rows at a time, the exp and dS's terms applied in registers
 * (attention_tiles.h), and each tile's dQ is updated while its dS is in
 * cache.
 */
#include <math.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/attention_blocks.h"
#include "kernels/attention_slices.h"
#include "kernels/attention_tiles.h"
#include "kernels/fast_exp.h"
#include "kernels/profile.h"

typedef struct {
    float *kt, *vt;     /* [HS, T_padded]: K and V transposed */
    float *probs, *dS;  /* [ATTN_BLOCK, ATTN_BLOCK] */
    float *dk, *dv;     /* [ATTN_BLOCK, HS] */
    float *D;           /* [T_padded]: rowsum(dout * out) */
    float *q, *dout;    /* [DT_TILE_ROWS, HS]: a tile at the end of the sequence */
} backward_scratch;

/* The scratch's size, and with a base its pointers (attn_scratch_carve). */
static size_t backward_scratch_layout(backward_scratch *s, float *base, const attn_dims *d)
{
    float **const at[] = {&s->kt, &s->vt, &s->probs, &s->dS, &s->dk,
                          &s->dv, &s->D,  &s->q,     &s->dout};
    const size_t packed = (size_t)d->HS * d->T_padded, block = ATTN_BLOCK * ATTN_BLOCK;
    const size_t grad = (size_t)ATTN_BLOCK * d->HS, tile = (size_t)DT_TILE_ROWS * d->HS;
    const size_t floats[] = {packed, packed, block, block, grad, grad, (size_t)d->T_padded,
                             tile, tile};
    return attn_scratch_carve(base, at, floats, (int)(sizeof floats / sizeof *floats));
}

#if defined(ATTN_TILES)
/* A tile of query rows [r0, r0 + DT_TILE_ROWS) against the key block at
 * k0: from rows of src (q or dout, ld apart), or from a zero-padded copy
 * in buf where the tile runs past the sequence. */
static attn_tile make_tile(const attn_dims *d, const float *src, size_t ld, float *buf,
                           const float *bt, int r0, int rows, int k0, int width)
{
    attn_tile t = {.a = src + r0 * ld, .a_row = ld, .bt = bt + k0,
                   .bt_row = (size_t)d->T_padded, .HS = d->HS, .rows = rows,
                   .first = r0 + 1 - k0, .width = width, .scale = d->scale};
    if (r0 + DT_TILE_ROWS > d->T) {
        attn_tile_load(buf, t.a, ld, rows, d->HS);
        t.a = buf, t.a_row = (size_t)d->HS;
    }
    return t;
}

/* P and dS of queries [q0, q0 + bq) against the key block at k0, a
 * register tile of rows at a time, each tile's dq updated while its dS is
 * in cache. */
static void block_grads(const backward_scratch *s, const attn_dims *d, const float *q,
                        const float *k, const float *dout, const float *lse, float *dq, int q0,
                        int k0, int bk)
{
    int bq = d->T - q0 < ATTN_BLOCK ? d->T - q0 : ATTN_BLOCK;
    for (int t0 = 0; t0 < bq; t0 += DT_TILE_ROWS) {
        int rows = bq - t0 < DT_TILE_ROWS ? bq - t0 : DT_TILE_ROWS, r0 = q0 + t0;
        int width = q0 == k0 && t0 + DT_TILE_ROWS < bk ? t0 + DT_TILE_ROWS : bk;
        float *p = s->probs + t0 * ATTN_BLOCK, *ds = s->dS + t0 * ATTN_BLOCK;
        attn_tile tq = make_tile(d, q, d->ld, s->q, s->kt, r0, rows, k0, width);
        attn_tile_probs(&tq, lse + r0, p);
        attn_tile tdo = make_tile(d, dout, d->ld_out, s->dout, s->vt, r0, rows, k0, width);
        attn_tile_dscores(&tdo, s->D + r0, p, ds);
        attn_block_gemm(BLOCK_FULL, rows, width, d->HS, ds, ATTN_BLOCK, 1, k + k0 * d->ld, d->ld,
                        dq + r0 * d->ld, d->ld, k0 > 0);
    }
}
#else
/* scores -> probabilities, zero where the mask hides the key. Whole-width
 * loops with the hidden entries selected away vectorise without remainders
 * (the rows are initialised memory beyond bk: the scratch starts zeroed). */
static void probabilities(float *p, const float *lse, int bq, int bk, int diagonal, float scale)
{
    for (int r = 0; r < bq; r++) {
        float *row = p + r * ATTN_BLOCK;
        int visible = diagonal ? r + 1 : bk;
        float row_lse = lse[r];
#pragma omp simd
        for (int j = 0; j < ATTN_BLOCK; j++)
            row[j] = j < visible ? dt_fast_expf(row[j] * scale - row_lse) : 0.0f;
    }
}

/* dP (in dS) -> dS = P (dP - D) scale; hidden entries set to zero, not
 * multiplied: the causal products leave them uncomputed. */
static void score_grads(float *dS, const float *p, const float *D, int bq, int bk, int diagonal,
                        float scale)
{
    for (int r = 0; r < bq; r++) {
        float *row = dS + r * ATTN_BLOCK;
        const float *prow = p + r * ATTN_BLOCK;
        int visible = diagonal ? r + 1 : bk;
        float row_D = D[r];
#pragma omp simd
        for (int j = 0; j < ATTN_BLOCK; j++)
            row[j] = j < visible ? prow[j] * (row[j] - row_D) * scale : 0.0f;
    }
}

static void block_grads(const backward_scratch *s, const attn_dims *d, const float *q,
                        const float *k, const float *dout, const float *lse, float *dq, int q0,
                        int k0, int bk)
{
    int bq = d->T - q0 < ATTN_BLOCK ? d->T - q0 : ATTN_BLOCK, diagonal = q0 == k0;
    block_shape by_width = diagonal ? BLOCK_CAUSAL_WIDTH : BLOCK_FULL;
    attn_block_gemm(by_width, bq, d->HS, bk, q + q0 * d->ld, d->ld, 1, s->kt + k0, d->T_padded,
                    s->probs, ATTN_BLOCK, 0);
    probabilities(s->probs, lse + q0, bq, bk, diagonal, d->scale);
    attn_block_gemm(by_width, bq, d->HS, bk, dout + q0 * d->ld_out, d->ld_out, 1, s->vt + k0,
                    d->T_padded, s->dS, ATTN_BLOCK, 0);
    score_grads(s->dS, s->probs, s->D + q0, bq, bk, diagonal, d->scale);
    attn_block_gemm(diagonal ? BLOCK_CAUSAL_K_END : BLOCK_FULL, bq, bk, d->HS, s->dS, ATTN_BLOCK,
                    1, k + k0 * d->ld, d->ld, dq + q0 * d->ld, d->ld, k0 > 0);
}
#endif

/* One query block against one key block: adds to s->dk, s->dv and dq. */
static void block_pair(const backward_scratch *s, const attn_dims *d, const float *q,
                       const float *k, const float *dout, const float *lse, float *dq, int q0,
                       int k0, int bk)
{
    int bq = d->T - q0 < ATTN_BLOCK ? d->T - q0 : ATTN_BLOCK;
    block_shape k_from_row = q0 == k0 ? BLOCK_CAUSAL_K_BEGIN : BLOCK_FULL;
    block_grads(s, d, q, k, dout, lse, dq, q0, k0, bk);
    attn_block_gemm(k_from_row, bk, bq, d->HS, s->probs, 1, ATTN_BLOCK, dout + q0 * d->ld_out,
                    d->ld_out, s->dv, d->HS, 1);
    attn_block_gemm(k_from_row, bk, bq, d->HS, s->dS, 1, ATTN_BLOCK, q + q0 * d->ld, d->ld, s->dk,
                    d->HS, 1);
}

static void row_dots(float *D, const float *dout, const float *out, const attn_dims *d)
{
    for (int t = 0; t < d->T; t++) {
        const float *a = dout + t * d->ld_out, *b = out + t * d->ld_out;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < d->HS; j++) sum += a[j] * b[j];
        D[t] = sum;
    }
}

/* q, dq: the slice's first q row in qkv and dqkv (k and v follow at +C,
 * +2C); dout, out: its first row in those. */
static void backward_head(const backward_scratch *s, const attn_dims *d, const float *q,
                          float *dq, const float *dout, const float *out, const float *lse, int C)
{
    const float *k = q + C, *v = q + 2 * (size_t)C;
    float *dk = dq + C, *dv = dq + 2 * (size_t)C;
    attn_pack_transposed(s->kt, k, d);
    attn_pack_transposed(s->vt, v, d);
    row_dots(s->D, dout, out, d);
    for (int k0 = 0; k0 < d->T; k0 += ATTN_BLOCK) {
        int bk = d->T - k0 < ATTN_BLOCK ? d->T - k0 : ATTN_BLOCK;
        memset(s->dk, 0, (size_t)bk * d->HS * sizeof(float));
        memset(s->dv, 0, (size_t)bk * d->HS * sizeof(float));
        for (int q0 = k0; q0 < d->T; q0 += ATTN_BLOCK)
            block_pair(s, d, q, k, dout, lse, dq, q0, k0, bk);
        for (int r = 0; r < bk; r++) {
            memcpy(dk + (k0 + r) * d->ld, s->dk + (size_t)r * d->HS, (size_t)d->HS * sizeof(float));
            memcpy(dv + (k0 + r) * d->ld, s->dv + (size_t)r * d->HS, (size_t)d->HS * sizeof(float));
        }
    }
}

typedef struct {
    float *dqkv;
    const float *dout, *qkv, *out, *lse;
    int T, C, NH;
    attn_dims d;
} backward_call;

/* A slice's first element in qkv and dqkv (same layout), and in out and dout. */
static size_t qkv_offset(const backward_call *g, int b, int h)
{
    return (size_t)b * g->T * g->d.ld + (size_t)h * g->d.HS;
}

static size_t out_offset(const backward_call *g, int b, int h)
{
    return (size_t)b * g->T * g->d.ld_out + (size_t)h * g->d.HS;
}

static void backward_slice(const void *ctx, void *scratch, int b, int h)
{
    const backward_call *g = ctx;
    backward_scratch s = {0};
    backward_scratch_layout(&s, scratch, &g->d);
    size_t qo = qkv_offset(g, b, h), oo = out_offset(g, b, h);
    backward_head(&s, &g->d, g->qkv + qo, g->dqkv + qo, g->dout + oo, g->out + oo,
                  g->lse + ((size_t)b * g->NH + h) * g->T, g->C);
}

static void backward_fail(const void *ctx, int b, int h)
{
    const backward_call *g = ctx;
    for (int part = 0; part < 3; part++)
        attn_fill_nan(g->dqkv + qkv_offset(g, b, h) + (size_t)part * g->C, g->d.ld, g->T,
                      g->d.HS);
}

static void attention_backward_body(float *dqkv, const float *dout, const float *qkv,
                                    const float *out, const float *lse, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || NH <= 0 || C <= 0) return;
    backward_call g = {dqkv, dout, qkv, out, lse, T, C, NH, attn_make_dims(T, C, NH)};
    backward_scratch sizing; /* the layout names its arrays even when only sizing */
    attn_slices job = {.scratch_bytes = backward_scratch_layout(&sizing, NULL, &g.d),
                       .run = backward_slice, .fail = backward_fail, .ctx = &g,
                       .what = "attention backward: out of memory, gradient set to NaN"};
    attn_run_slices(&job, B, NH);
}

void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int C, int NH)
{
    const uint64_t t0 = dt_prof_begin();
    attention_backward_body(dqkv, dout, qkv, out, lse, B, T, C, NH);
    dt_prof_end(DT_PROF_ATTENTION, t0, 5.0 * (double)B * T * T * C,
                4.0 * (9.0 * B * T * C + (double)B * NH * T));
}
