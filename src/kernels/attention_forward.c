/*
 * Causal self-attention, forward, flash style.
 *   qkv [B, T, 3C] (q, k, v each [NH, HS] per token), out [B, T, C],
 *   lse [B, NH, T]
 * Each thread takes whole (batch, head) slices (attention_slices.h). For
 * a block of 64 queries it walks the key blocks up to the diagonal, forming
 * 64 x 64 scores at a time and keeping, per query, the running maximum m,
 * the running sum l of exp(score - m) and the unnormalised output; when m
 * grows, l and the output are rescaled by exp(m_old - m_new). At the end
 * out = output / l and lse = m + log(l) is saved for backward.
 *
 * With AVX-512 or AVX2 + FMA the scores of a block are formed a register
 * tile of rows at a time and become probabilities before they leave the
 * tile (attention_tiles.h; with AVX2 a tile wider than its 16 keys of
 * registers passes its stored scores once more); otherwise they are stored
 * and then folded in row by row. Measured on the benchmark model's shape
 * (1 thread): the AVX-512 tiles made the forward about 10% faster, the
 * scores' softmax pass having cost a third of its time; the AVX2 ones
 * about 5% (a Zen 4 built without AVX-512, whose AVX2 exp takes twice the
 * AVX-512 one's instructions a lane).
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
    float *kt;      /* [HS, T_padded]: K transposed */
    float *scores;  /* [ATTN_BLOCK, ATTN_BLOCK]: scores, then probabilities */
    float *acc;     /* [ATTN_BLOCK, HS]: unnormalised output of the query group */
    float *q;       /* [DT_TILE_ROWS, HS]: a tile at the end of the sequence */
    float *m, *l;   /* [ATTN_BLOCK] */
    float *rescale; /* [ATTN_BLOCK]: each row's factor for its output so far */
} forward_scratch;

/* The scratch's size, and with a base its pointers (attn_scratch_carve). */
static size_t forward_scratch_layout(forward_scratch *s, float *base, const attn_dims *d)
{
    float **const at[] = {&s->kt, &s->scores, &s->acc, &s->q, &s->m, &s->l, &s->rescale};
    const size_t floats[] = {(size_t)d->HS * d->T_padded, ATTN_BLOCK * ATTN_BLOCK,
                             (size_t)ATTN_BLOCK * d->HS, (size_t)DT_TILE_ROWS * d->HS,
                             ATTN_BLOCK, ATTN_BLOCK, ATTN_BLOCK};
    return attn_scratch_carve(base, at, floats, (int)(sizeof floats / sizeof *floats));
}

static void start_rows(const forward_scratch *s, int rows, int HS)
{
    for (int r = 0; r < rows; r++) {
        s->m[r] = -INFINITY;
        s->l[r] = 0.0f;
    }
    memset(s->acc, 0, (size_t)rows * HS * sizeof(float));
}

/* out = acc / l and lse = m + log(l) for rows [q0, q0 + rows) */
static void finish_rows(const forward_scratch *s, const attn_dims *d, float *out, float *lse,
                        int q0, int rows)
{
    for (int r = 0; r < rows; r++) {
        float inv_l = 1.0f / s->l[r];
        float *o = out + (q0 + r) * d->ld_out;
        const float *acc = s->acc + (size_t)r * d->HS;
#pragma omp simd
        for (int j = 0; j < d->HS; j++) o[j] = acc[j] * inv_l;
        lse[q0 + r] = s->m[r] + logf(s->l[r]);
    }
}

#if defined(ATTN_TILES)
/* The scores of queries [q0, q0 + bq) against the keys of the block at k0,
 * folded into the rows' running softmax a register tile at a time: the
 * probabilities land in s->scores, each row's rescale factor beside. */
static void block_softmax(const forward_scratch *s, const attn_dims *d, const float *q, int q0,
                          int bq, int k0)
{
    for (int t0 = 0; t0 < bq; t0 += ATTN_TILE_ROWS) {
        int rows = bq - t0 < ATTN_TILE_ROWS ? bq - t0 : ATTN_TILE_ROWS;
        int diagonal_width = bq < t0 + ATTN_TILE_ROWS ? bq : t0 + ATTN_TILE_ROWS;
        attn_tile t = {.a = q + (q0 + t0) * d->ld, .a_row = d->ld, .bt = s->kt + k0,
                       .bt_row = (size_t)d->T_padded, .HS = d->HS, .rows = rows,
                       .first = q0 + t0 + 1 - k0,
                       .width = k0 == q0 ? diagonal_width : ATTN_BLOCK, .scale = d->scale};
        if (q0 + t0 + ATTN_TILE_ROWS > d->T) {
            attn_tile_load(s->q, t.a, d->ld, rows, d->HS);
            t.a = s->q, t.a_row = (size_t)d->HS;
        }
        attn_tile_softmax_state st = {s->m + t0, s->l + t0, s->rescale + t0,
                                      s->scores + t0 * ATTN_BLOCK};
        attn_tile_softmax(&t, &st);
    }
    for (int r = 0; r < bq; r++) {
        if (s->rescale[r] == 1.0f) continue;
        float *acc = s->acc + (size_t)r * d->HS, f = s->rescale[r];
#pragma omp simd
        for (int j = 0; j < d->HS; j++) acc[j] *= f;
    }
}
#else
/* Folds one block of scores into the running softmax of each query row
 * (attn_softmax_row); on the diagonal, row r sees keys up to its own. */
static void online_softmax(const forward_scratch *s, int bq, int bk, int diagonal, int HS,
                           float scale)
{
    for (int r = 0; r < bq; r++)
        attn_softmax_row(s->scores + r * ATTN_BLOCK, diagonal ? r + 1 : bk, scale, &s->m[r],
                         &s->l[r], s->acc + (size_t)r * HS, HS);
}
#endif

static void query_block(const forward_scratch *s, const attn_dims *d, const float *q,
                        const float *v, float *out, float *lse, int q0)
{
    int bq = d->T - q0 < ATTN_BLOCK ? d->T - q0 : ATTN_BLOCK;
    start_rows(s, bq, d->HS);
    for (int k0 = 0; k0 <= q0; k0 += ATTN_BLOCK) {
        int diagonal = k0 == q0, bk = diagonal ? bq : ATTN_BLOCK;
#if defined(ATTN_TILES)
        block_softmax(s, d, q, q0, bq, k0);
#else
        attn_block_gemm(diagonal ? BLOCK_CAUSAL_WIDTH : BLOCK_FULL, bq, d->HS, bk,
                        q + q0 * d->ld, d->ld, 1, s->kt + k0, d->T_padded, s->scores, ATTN_BLOCK,
                        0);
        online_softmax(s, bq, bk, diagonal, d->HS, d->scale);
#endif
        attn_block_gemm(diagonal ? BLOCK_CAUSAL_K_END : BLOCK_FULL, bq, bk, d->HS, s->scores,
                        ATTN_BLOCK, 1, v + k0 * d->ld, d->ld, s->acc, d->HS, 1);
    }
    finish_rows(s, d, out, lse, q0, bq);
}

typedef struct {
    float *out, *lse;
    const float *qkv;
    int T, C, NH;
    attn_dims d;
} forward_call;

static void forward_slice(const void *ctx, void *scratch, int b, int h)
{
    const forward_call *f = ctx;
    const attn_dims *d = &f->d;
    forward_scratch s = {0};
    forward_scratch_layout(&s, scratch, d);
    const float *q = f->qkv + (size_t)b * f->T * d->ld + (size_t)h * d->HS;
    float *o = f->out + (size_t)b * f->T * d->ld_out + (size_t)h * d->HS;
    float *lse = f->lse + ((size_t)b * f->NH + h) * f->T;
    attn_pack_transposed(s.kt, q + f->C, d);
    for (int q0 = 0; q0 < f->T; q0 += ATTN_BLOCK)
        query_block(&s, d, q, q + 2 * (size_t)f->C, o, lse, q0);
}

static void forward_fail(const void *ctx, int b, int h)
{
    const forward_call *f = ctx;
    attn_fill_nan(f->out + (size_t)b * f->T * f->d.ld_out + (size_t)h * f->d.HS, f->d.ld_out,
                  f->T, f->d.HS);
}

static void attention_forward_body(float *out, float *lse, const float *qkv, int B, int T, int C,
                                   int NH)
{
    if (B <= 0 || T <= 0 || NH <= 0 || C <= 0) return;
    forward_call f = {out, lse, qkv, T, C, NH, attn_make_dims(T, C, NH)};
    forward_scratch sizing; /* the layout names its arrays even when only sizing */
    attn_slices job = {.scratch_bytes = forward_scratch_layout(&sizing, NULL, &f.d),
                       .run = forward_slice, .fail = forward_fail, .ctx = &f,
                       .what = "attention forward: out of memory, output set to NaN"};
    attn_run_slices(&job, B, NH);
}

void dt_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH)
{
    const uint64_t t0 = dt_prof_begin();
    attention_forward_body(out, lse, qkv, B, T, C, NH);
    dt_prof_end(DT_PROF_ATTENTION, t0, 2.0 * (double)B * T * T * C,
                4.0 * (4.0 * B * T * C + (double)B * NH * T));
}
