/*
 * Register tiles for the attention kernels: a tile of ATTN_TILE_ROWS
 * query rows against the keys of a block, its scores formed in registers
 * and turned into probabilities (or, backward, score gradients) before
 * they are stored, so that no pass over a block of scores in memory is
 * needed for the scale, the mask or the exp. The exp is 2^x
 * (fast_exp.h), the scale by log2(e) folded into the scores' scale.
 *
 * The tiles are written once over attention_vec.h's vector: 16 lanes with
 * AVX-512, 8 with AVX2 + FMA. A tile holds ATTN_TILE_CHUNK keys in
 * registers (64 with AVX-512: the whole block; 16 with AVX2), and a wider
 * tile is walked a chunk of keys at a time (attn_tile_chunk). The backward
 * tiles are elementwise per row and do each chunk whole. The forward's
 * softmax needs each row's maximum over the whole block first: a tile
 * that fits one chunk does it all in registers; a wider one (AVX2 only)
 * stores its masked scores and the rows' maxima chunk by chunk, then turns
 * the stored rows into probabilities in one more pass, still in L1, with
 * the same arithmetic (the same bits as in registers).
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
 * The number of vectors is a literal at every instantiation (the
 * switches below), so the accumulators stay in registers, as in
 * tile_gemm.h; a chunk every row sees in full has an instantiation
 * without masks.
 */
#ifndef DT_KERNELS_ATTENTION_TILES_H
#define DT_KERNELS_ATTENTION_TILES_H

#include "kernels/attention_vec.h"

#if defined(ATTN_LANES)
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/attention_blocks.h"
#include "kernels/fast_exp.h"
#include "kernels/tile_gemm.h"

/* the kernels' test for the tiles: defined where they are built */
#define ATTN_TILES 1
#define ATTN_TILE_ROWS DT_TILE_ROWS
#define ATTN_TILE_CHUNK (ATTN_LANES * ATTN_TILE_VECS)

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

static inline int attn_tile_visible(const attn_tile *t, int r)
{
    int visible = t->first + r;
    return visible < 0 ? 0 : visible > t->width ? t->width : visible;
}

/* The keys [c0, c0 + ATTN_TILE_CHUNK) of t's block as a tile of their own */
static inline attn_tile attn_tile_chunk(const attn_tile *t, int c0)
{
    attn_tile c = *t;
    c.bt += c0;
    c.first -= c0;
    c.width = t->width - c0 < ATTN_TILE_CHUNK ? t->width - c0 : ATTN_TILE_CHUNK;
    return c;
}

/* s[r][v] = sum over k < HS of a[r * a_row + k] * bt[k * bt_row + LANES v + lane] */
static inline __attribute__((always_inline)) void
attn_tile_product(const int VECS, attn_vec s[ATTN_TILE_ROWS][ATTN_TILE_VECS], const attn_tile *t)
{
    const float *a = t->a, *b = t->bt;
    const size_t a_row = t->a_row, b_row = t->bt_row;
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++)
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) s[r][v] = attn_vec_zero();
    for (int k = 0; k < t->HS; k++) {
        attn_vec bv[ATTN_TILE_VECS];
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            bv[v] = attn_vec_load(b + k * b_row + ATTN_LANES * v);
            DT_TILE_KEEP_IN_REGISTER(bv[v]);
        }
#pragma GCC unroll 6
        for (int r = 0; r < ATTN_TILE_ROWS; r++) {
            attn_vec x = attn_vec_set1(a[r * a_row + k]);
#pragma GCC unroll 4
            for (int v = 0; v < VECS; v++) s[r][v] = attn_vec_fmadd(x, bv[v], s[r][v]);
        }
    }
}

/* The largest of a row's first `visible` scores (all of them without
 * EDGE); the hidden ones become -inf in s. */
static inline __attribute__((always_inline)) float
attn_tile_row_max(const int VECS, const int EDGE, attn_vec s[ATTN_TILE_VECS], int visible)
{
    const attn_vec none = attn_vec_set1(-INFINITY);
    attn_vec hi = none;
#pragma GCC unroll 4
    for (int v = 0; v < VECS; v++) {
        if (EDGE) s[v] = attn_vec_select(attn_vec_lanes(visible, v), s[v], none);
        hi = attn_vec_max(hi, s[v]);
    }
    return attn_vec_reduce_max(hi);
}

/* The running softmax of the forward pass, one tile of scores folded in:
 * m, l: each row's maximum (scaled) and sum of exp so far; rescale: what
 * the row's output so far is to be multiplied by; p: probabilities
 * relative to the new maximum, rows ATTN_BLOCK apart. */
typedef struct {
    float *m, *l, *rescale, *p;
} attn_tile_softmax_state;

/* Row r's block maximum (of the unscaled scores) folded into its state:
 * the new maximum in m, the factor for what came before in rescale and
 * applied to l. Returns the shift for exp2: the new maximum times
 * log2(e). */
static inline float attn_tile_row_start(const attn_tile_softmax_state *st, int r, int visible,
                                        float block_max, float scale)
{
    /* scale > 0: the maximum of the scaled scores is the scaled maximum */
    block_max *= scale;
    float m_old = st->m[r], m_new = block_max > m_old ? block_max : m_old;
    /* a row that sees no key keeps its state: -inf - -inf would be NaN */
    float rescale = visible == 0 ? 1.0f : dt_fast_expf(m_old - m_new);
    if (visible == 0) m_new = m_old;
    st->m[r] = m_new;
    st->rescale[r] = rescale;
    st->l[r] *= rescale;
    return m_new * DT_EXP_LOG2E;
}

/* A tile that fits one chunk, all in registers. The rows go through each
 * step together (all maxima, then all shifts, then all exps): a row's
 * chain of maximum, horizontal reduction, scalar rescale, exp and sum is
 * long and its four vectors alone cannot hide it, where the tile's six
 * rows side by side can (the forward 3% faster on the benchmark model's
 * shape, AVX-512, denormals flushed as in training); each row's
 * arithmetic, and so every bit, is the same either way. */
static inline __attribute__((always_inline)) void
attn_tile_softmax_vecs(const int VECS, const int EDGE, const attn_tile *t,
                       const attn_tile_softmax_state *st)
{
    attn_vec s[ATTN_TILE_ROWS][ATTN_TILE_VECS], scale2 = attn_vec_set1(t->scale * DT_EXP_LOG2E);
    attn_vec sum[ATTN_TILE_ROWS];
    float shift[ATTN_TILE_ROWS];
    int visible[ATTN_TILE_ROWS];
    attn_tile_product(VECS, s, t);
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++) {
        visible[r] = EDGE ? attn_tile_visible(t, r) : ATTN_LANES * VECS;
        shift[r] = attn_tile_row_max(VECS, EDGE, s[r], visible[r]);
        sum[r] = attn_vec_zero();
    }
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++)
        if (r < t->rows) shift[r] = attn_tile_row_start(st, r, visible[r], shift[r], t->scale);
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++) {
        if (r >= t->rows) break;
        attn_vec row_shift = attn_vec_set1(shift[r]);
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            attn_vec p = attn_vec_exp2(attn_vec_fmsub(s[r][v], scale2, row_shift));
            if (EDGE) p = attn_vec_select_or_zero(attn_vec_lanes(visible[r], v), p);
            attn_vec_store(st->p + r * ATTN_BLOCK + ATTN_LANES * v, p);
            sum[r] = attn_vec_add(sum[r], p);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++)
        if (r < t->rows) st->l[r] += attn_vec_reduce_add(sum[r]);
}

/* One chunk of a wider tile: its scores stored in p (rows ATTN_BLOCK
 * apart), -inf where hidden, each row's maximum so far in hi. */
static inline __attribute__((always_inline)) void
attn_tile_scores_vecs(const int VECS, const int EDGE, const attn_tile *t, float *p, float *hi)
{
    attn_vec s[ATTN_TILE_ROWS][ATTN_TILE_VECS];
    attn_tile_product(VECS, s, t);
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++) {
        if (r >= t->rows) break;
        int visible = EDGE ? attn_tile_visible(t, r) : ATTN_LANES * VECS;
        float block_max = attn_tile_row_max(VECS, EDGE, s[r], visible);
        hi[r] = block_max > hi[r] ? block_max : hi[r];
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) attn_vec_store(p + r * ATTN_BLOCK + ATTN_LANES * v, s[r][v]);
    }
}

/* The stored scores of a wider tile, each row's maximum in hi, folded into
 * the state as attn_tile_softmax_vecs does it in registers. Vectors of no
 * visible key are zeroed without an exp; in the others the -inf of the
 * hidden keys gives 0. */
static inline void attn_tile_softmax_stored(const attn_tile *t, const attn_tile_softmax_state *st,
                                            const float *hi)
{
    attn_vec scale2 = attn_vec_set1(t->scale * DT_EXP_LOG2E);
    for (int r = 0; r < t->rows; r++) {
        int visible = attn_tile_visible(t, r), j = 0;
        attn_vec sum = attn_vec_zero();
        attn_vec shift = attn_vec_set1(attn_tile_row_start(st, r, visible, hi[r], t->scale));
        float *p = st->p + r * ATTN_BLOCK;
        for (; j < visible; j += ATTN_LANES) {
            attn_vec e = attn_vec_exp2(attn_vec_fmsub(attn_vec_load(p + j), scale2, shift));
            attn_vec_store(p + j, e);
            sum = attn_vec_add(sum, e);
        }
        for (; j < t->width; j += ATTN_LANES) attn_vec_store(p + j, attn_vec_zero());
        st->l[r] += attn_vec_reduce_add(sum);
    }
}

/* Backward: p = exp(scale s - lse), zero for hidden keys, rows
 * ATTN_BLOCK apart. */
static inline __attribute__((always_inline)) void
attn_tile_probs_vecs(const int VECS, const int EDGE, const attn_tile *t, const float *lse,
                     float *p)
{
    attn_vec s[ATTN_TILE_ROWS][ATTN_TILE_VECS], scale2 = attn_vec_set1(t->scale * DT_EXP_LOG2E);
    attn_tile_product(VECS, s, t);
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++) {
        if (r >= t->rows) break;
        int visible = EDGE ? attn_tile_visible(t, r) : ATTN_LANES * VECS;
        attn_vec shift = attn_vec_set1(lse[r] * DT_EXP_LOG2E);
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            attn_vec e = attn_vec_exp2(attn_vec_fmsub(s[r][v], scale2, shift));
            if (EDGE) e = attn_vec_select_or_zero(attn_vec_lanes(visible, v), e);
            attn_vec_store(p + r * ATTN_BLOCK + ATTN_LANES * v, e);
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
    attn_vec s[ATTN_TILE_ROWS][ATTN_TILE_VECS];
    attn_tile_product(VECS, s, t);
#pragma GCC unroll 6
    for (int r = 0; r < ATTN_TILE_ROWS; r++) {
        if (r >= t->rows) break;
        int visible = EDGE ? attn_tile_visible(t, r) : ATTN_LANES * VECS;
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            attn_vec pr = attn_vec_load(p + r * ATTN_BLOCK + ATTN_LANES * v);
            attn_vec g = attn_vec_mul(pr, attn_vec_sub(s[r][v], attn_vec_set1(D[r])));
            g = attn_vec_mul(g, attn_vec_set1(t->scale));
            if (EDGE) g = attn_vec_select_or_zero(attn_vec_lanes(visible, v), g);
            attn_vec_store(ds + r * ATTN_BLOCK + ATTN_LANES * v, g);
        }
    }
}

/* Runs CALL(VECS, EDGE, c, c0) on each chunk c of keys [c0, ...) of tile
 * t: one instantiation per vector count, and one without masks for a
 * whole chunk that every row sees in full (every chunk below the
 * diagonal). */
#if ATTN_TILE_VECS == 4
#define ATTN_TILE_PART_CASES(c, c0, CALL)                                                        \
    case 1: CALL(1, 1, c, c0); break;                                                            \
    case 2: CALL(2, 1, c, c0); break;                                                            \
    case 3: CALL(3, 1, c, c0); break;
#else
#define ATTN_TILE_PART_CASES(c, c0, CALL) case 1: CALL(1, 1, c, c0); break;
#endif
#define ATTN_TILE_CHUNKS(t, CALL)                                                                \
    for (int c0 = 0; c0 < (t)->width; c0 += ATTN_TILE_CHUNK) {                                   \
        attn_tile c = attn_tile_chunk((t), c0);                                                  \
        if (c.width == ATTN_TILE_CHUNK && c.first >= ATTN_TILE_CHUNK) {                          \
            CALL(ATTN_TILE_VECS, 0, &c, c0);                                                     \
        } else {                                                                                 \
            switch ((c.width + ATTN_LANES - 1) / ATTN_LANES) {                                   \
                ATTN_TILE_PART_CASES(&c, c0, CALL)                                               \
            default: CALL(ATTN_TILE_VECS, 1, &c, c0); break;                                     \
            }                                                                                    \
        }                                                                                        \
    }

/* One chunk, in registers (always, with AVX-512); or, wider, chunk by
 * chunk through the stored scores. */
static inline void attn_tile_softmax(const attn_tile *t, const attn_tile_softmax_state *st)
{
    if (ATTN_TILE_CHUNK >= ATTN_BLOCK || t->width <= ATTN_TILE_CHUNK) {
#define ATTN_CALL(V, E, c, c0) attn_tile_softmax_vecs(V, E, c, st)
        ATTN_TILE_CHUNKS(t, ATTN_CALL)
#undef ATTN_CALL
        return;
    }
    float hi[ATTN_TILE_ROWS];
    for (int r = 0; r < ATTN_TILE_ROWS; r++) hi[r] = -INFINITY;
#define ATTN_CALL(V, E, c, c0) attn_tile_scores_vecs(V, E, c, st->p + (c0), hi)
    ATTN_TILE_CHUNKS(t, ATTN_CALL)
#undef ATTN_CALL
    attn_tile_softmax_stored(t, st, hi);
}

static inline void attn_tile_probs(const attn_tile *t, const float *lse, float *p)
{
#define ATTN_CALL(V, E, c, c0) attn_tile_probs_vecs(V, E, c, lse, p + (c0))
    ATTN_TILE_CHUNKS(t, ATTN_CALL)
#undef ATTN_CALL
}

static inline void attn_tile_dscores(const attn_tile *t, const float *D, const float *p,
                                     float *ds)
{
#define ATTN_CALL(V, E, c, c0) attn_tile_dscores_vecs(V, E, c, D, p + (c0), ds + (c0))
    ATTN_TILE_CHUNKS(t, ATTN_CALL)
#undef ATTN_CALL
}

#undef ATTN_TILE_CHUNKS
#undef ATTN_TILE_PART_CASES

#endif

#endif
