/*
 * AVX-512 register tiles for the attention kernels: a tile of
 * ATTN_TILE_ROWS query rows against up to 64 keys of a block, its scores
 * formed in registers and turned into probabilities (or, backward, score
 * gradients) before they are stored, so that no pass over a block of
 * scores in memory is needed for the scale, the mask, the exp or the row
 * sums. The exp is dt_fast_exp2_512, the scale by log2(e) folded into the
 * scores' scale.
 *
 * Queries come from their rows in qkv, or from a zero-padded copy
 * (attn_tile_load) where the tile runs past the end of the sequence, so
 * the register tile always has ATTN_TILE_ROWS rows; only the real rows are
 * stored. Keys come from K or V transposed ([HS, T_padded]: every load is
 * a whole vector inside the padded row). Row r of a tile sees the first
 * min(first + r, width) keys of the block; the others get zero. Every
 * vector of the width is stored, zero beyond a row's keys, which is what
 * the causal block products of attention_blocks.h read.
 *
 * The number of 16-key vectors is a literal at every instantiation (the
 * switches below), so the 6 x 4 accumulators stay in registers, as in
 * tile_gemm.h; a block every row sees in full has an instantiation
 * without masks.
 */
#ifndef DT_KERNELS_ATTENTION_TILES_H
#define DT_KERNELS_ATTENTION_TILES_H

#if defined(__AVX512F__)
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/attention_blocks.h"
#include "kernels/fast_exp.h"
#include "kernels/tile_gemm.h"

#define ATTN_TILE_ROWS DT_TILE_ROWS

/* One tile: rows of the query-side operand (queries, or dout for the
 * score gradients) against the keys of a block. */
typedef struct {
    const float *a;    /* the tile's first row, of HS floats */
    size_t a_row;      /* distance between its rows */
    const float *bt;   /* K^T or V^T ([HS, T_padded]) at the block's first key */
    size_t bt_row;     /* T_padded */
    int HS;
    int rows;          /* real rows: only these are stored */
    int first, width;  /* row r sees min(first + r, width) keys of the block */
    float scale;
} attn_tile;

/* dst[r * HS + j] = src[r * ld + j] for r < rows, zero for the rows after:
 * a tile at the end of the sequence, whose register rows must not read
 * past it. */
static inline void attn_tile_load(float *dst, const float *src, size_t ld, int rows, int HS)
{
    for (int r = 0; r < ATTN_TILE_ROWS; r++) {
        if (r < rows)
            memcpy(dst + (size_t)r * HS, src + r * ld, (size_t)HS * sizeof(float));
        else
            memset(dst + (size_t)r * HS, 0, (size_t)HS * sizeof(float));
    }
}

/* Lanes of vector v (keys 16 v ...) that lie below `visible`. */
static inline __mmask16 attn_tile_lanes(int visible, int v)
{
    int left = visible - 16 * v;
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
}

static inline int attn_tile_visible(const attn_tile *t, int r)
{
    int visible = t->first + r;
    return visible < 0 ? 0 : visible > t->width ? t->width : visible;
}

/* s[r][v] = sum over k < HS of a[r * a_row + k] * bt[k * bt_row + 16 v + lane] */
static inline __attribute__((always_inline)) void
attn_tile_product(const int VECS, __m512 s[ATTN_TILE_ROWS][4], const attn_tile *t)
{
    const float *a = t->a, *b = t->bt;
    const size_t a_row = t->a_row, b_row = t->bt_row;
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++)
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) s[r][v] = _mm512_setzero_ps();
    for (int k = 0; k < t->HS; k++) {
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            bv[v] = _mm512_loadu_ps(b + k * b_row + 16 * v);
            DT_TILE_KEEP_IN_REGISTER(bv[v]);
        }
#pragma GCC unroll 6
        for (int r = 0; r < ATTN_TILE_ROWS; r++) {
            __m512 x = _mm512_set1_ps(a[r * a_row + k]);
#pragma GCC unroll 4
            for (int v = 0; v < VECS; v++) s[r][v] = _mm512_fmadd_ps(x, bv[v], s[r][v]);
        }
    }
}

/* The running softmax of the forward pass, one tile of scores folded in:
 * m, l: each row's maximum (scaled) and sum of exp so far; rescale: what
 * the row's output so far is to be multiplied by; p: probabilities
 * relative to the new maximum, rows ATTN_BLOCK apart. */
typedef struct {
    float *m, *l, *rescale, *p;
} attn_tile_softmax_state;

static inline __attribute__((always_inline)) void
attn_tile_softmax_vecs(const int VECS, const int EDGE, const attn_tile *t,
                       const attn_tile_softmax_state *st)
{
    __m512 s[ATTN_TILE_ROWS][4], scale2 = _mm512_set1_ps(t->scale * DT_EXP_LOG2E);
    attn_tile_product(VECS, s, t);
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++) {
        if (r >= t->rows) break;
        int visible = EDGE ? attn_tile_visible(t, r) : 16 * VECS;
        __m512 hi = _mm512_set1_ps(-INFINITY);
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            if (EDGE) s[r][v] = _mm512_mask_blend_ps(attn_tile_lanes(visible, v), hi, s[r][v]);
            hi = _mm512_max_ps(hi, s[r][v]);
        }
        /* scale > 0: the maximum of the scaled scores is the scaled maximum */
        float block_max = _mm512_reduce_max_ps(hi) * t->scale;
        float m_old = st->m[r], m_new = block_max > m_old ? block_max : m_old;
        /* a row that sees no key keeps its state: -inf - -inf would be NaN */
        float rescale = visible == 0 ? 1.0f : dt_fast_expf(m_old - m_new);
        if (visible == 0) m_new = m_old;
        __m512 sum = _mm512_setzero_ps(), shift = _mm512_set1_ps(m_new * DT_EXP_LOG2E);
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            __m512 p = dt_fast_exp2_512(_mm512_fmsub_ps(s[r][v], scale2, shift));
            if (EDGE) p = _mm512_maskz_mov_ps(attn_tile_lanes(visible, v), p);
            _mm512_storeu_ps(st->p + r * ATTN_BLOCK + 16 * v, p);
            sum = _mm512_add_ps(sum, p);
        }
        st->l[r] = st->l[r] * rescale + _mm512_reduce_add_ps(sum);
        st->m[r] = m_new;
        st->rescale[r] = rescale;
    }
}

/* Backward: p = exp(scale s - lse), zero for hidden keys, rows
 * ATTN_BLOCK apart. */
static inline __attribute__((always_inline)) void
attn_tile_probs_vecs(const int VECS, const int EDGE, const attn_tile *t, const float *lse,
                     float *p)
{
    __m512 s[ATTN_TILE_ROWS][4], scale2 = _mm512_set1_ps(t->scale * DT_EXP_LOG2E);
    attn_tile_product(VECS, s, t);
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++) {
        if (r >= t->rows) break;
        int visible = EDGE ? attn_tile_visible(t, r) : 16 * VECS;
        __m512 shift = _mm512_set1_ps(lse[r] * DT_EXP_LOG2E);
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            __m512 e = dt_fast_exp2_512(_mm512_fmsub_ps(s[r][v], scale2, shift));
            if (EDGE) e = _mm512_maskz_mov_ps(attn_tile_lanes(visible, v), e);
            _mm512_storeu_ps(p + r * ATTN_BLOCK + 16 * v, e);
        }
    }
}

/* Backward: with dP = dO V^T formed in registers (the tile's operand is
 * dout, its keys V^T), ds = p (dP - D) scale, zero for hidden keys; p and
 * ds rows ATTN_BLOCK apart. */
static inline __attribute__((always_inline)) void
attn_tile_dscores_vecs(const int VECS, const int EDGE, const attn_tile *t, const float *D,
                       const float *p, float *ds)
{
    __m512 s[ATTN_TILE_ROWS][4];
    attn_tile_product(VECS, s, t);
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++) {
        if (r >= t->rows) break;
        int visible = EDGE ? attn_tile_visible(t, r) : 16 * VECS;
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            __m512 pr = _mm512_loadu_ps(p + r * ATTN_BLOCK + 16 * v);
            __m512 g = _mm512_mul_ps(pr, _mm512_sub_ps(s[r][v], _mm512_set1_ps(D[r])));
            __m512 f = _mm512_set1_ps(t->scale);
            g = EDGE ? _mm512_maskz_mul_ps(attn_tile_lanes(visible, v), g, f)
                     : _mm512_mul_ps(g, f);
            _mm512_storeu_ps(ds + r * ATTN_BLOCK + 16 * v, g);
        }
    }
}

/* One instantiation per vector count (1 to 4 vectors: up to 64 keys),
 * and one without masks for a whole block that every row sees in full
 * (every block below the diagonal). */
#define ATTN_TILE_DISPATCH(t, CALL)                                                              \
    if ((t)->width == ATTN_BLOCK && (t)->first >= ATTN_BLOCK) {                                  \
        CALL(4, 0);                                                                              \
    } else {                                                                                     \
        switch (((t)->width + 15) / 16) {                                                        \
        case 1: CALL(1, 1); break;                                                               \
        case 2: CALL(2, 1); break;                                                               \
        case 3: CALL(3, 1); break;                                                               \
        default: CALL(4, 1); break;                                                              \
        }                                                                                        \
    }

static inline void attn_tile_softmax(const attn_tile *t, const attn_tile_softmax_state *st)
{
#define ATTN_CALL(V, E) attn_tile_softmax_vecs(V, E, t, st)
    ATTN_TILE_DISPATCH(t, ATTN_CALL)
#undef ATTN_CALL
}

static inline void attn_tile_probs(const attn_tile *t, const float *lse, float *p)
{
#define ATTN_CALL(V, E) attn_tile_probs_vecs(V, E, t, lse, p)
    ATTN_TILE_DISPATCH(t, ATTN_CALL)
#undef ATTN_CALL
}

static inline void attn_tile_dscores(const attn_tile *t, const float *D, const float *p,
                                     float *ds)
{
#define ATTN_CALL(V, E) attn_tile_dscores_vecs(V, E, t, D, p, ds)
    ATTN_TILE_DISPATCH(t, ATTN_CALL)
#undef ATTN_CALL
}

#undef ATTN_TILE_DISPATCH

#endif

#endif
