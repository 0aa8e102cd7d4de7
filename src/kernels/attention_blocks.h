/*
 * Pieces shared by the attention forward and backward kernels: the layout
 * of one (batch, head) slice, the causal block products and the packing.
 *
 * Queries and keys are cut into blocks of ATTN_BLOCK at the same offsets,
 * so a query block sees every earlier key block in full and the key block
 * at its own offset (the diagonal block) through the causal mask. Inside the
 * diagonal block, a tile of rows [r0, r0 + R) needs only keys below r0 + R,
 * which is what the causal block shapes exploit: they skip the tiles that
 * the mask would zero anyway (40% of the work at T = 256).
 */
#ifndef DT_KERNELS_ATTENTION_BLOCKS_H
#define DT_KERNELS_ATTENTION_BLOCKS_H

#include <math.h>
#include <stddef.h>

#include "kernels/fast_exp.h"
#include "kernels/tile_gemm.h"

#define ATTN_BLOCK 64

/* One (batch, head) slice: q, k, v rows of HS floats, ld apart (3C);
 * out/dout rows ld_out apart (C). */
typedef struct {
    int T, HS;
    size_t ld, ld_out;
    int T_padded; /* T rounded up to 16, the row stride of packed K^T, V^T */
    float scale;  /* 1 / sqrt(HS) */
} attn_dims;

typedef enum {
    BLOCK_FULL,
    BLOCK_CAUSAL_WIDTH,   /* row r needs columns < r + 1 (scores: C columns are keys) */
    BLOCK_CAUSAL_K_END,   /* row r needs k < r + 1 (k runs over keys; A is zero above) */
    BLOCK_CAUSAL_K_BEGIN, /* row r needs k >= r (rows are keys, k runs over queries) */
} block_shape;

/* C[rows, width] (+)= A[rows, K] @ B[K, width], A element (r, k) at
 * A[r * a_row + k * a_col], B rows b_row apart, C rows c_row apart. With a
 * causal shape, the entries the shape leaves out are not computed. */
static inline void attn_block_gemm(block_shape shape, int rows, int K, int width,
                                   const float *A, size_t a_row, size_t a_col, const float *B,
                                   size_t b_row, float *C, size_t c_row, int accumulate)
{
    for (int r0 = 0; r0 < rows; r0 += DT_TILE_ROWS) {
        int R = rows - r0 < DT_TILE_ROWS ? rows - r0 : DT_TILE_ROWS;
        int k_begin = shape == BLOCK_CAUSAL_K_BEGIN ? r0 : 0;
        int k_end = shape == BLOCK_CAUSAL_K_END && r0 + R < K ? r0 + R : K;
        int w_end = shape == BLOCK_CAUSAL_WIDTH && r0 + R < width ? r0 + R : width;
        for (int c0 = 0; c0 < w_end; c0 += DT_TILE_COLS) {
            int w = w_end - c0 < DT_TILE_COLS ? w_end - c0 : DT_TILE_COLS;
            dt_tile_gemm_block(R, k_begin, k_end, w, A + r0 * a_row, a_row, a_col, B + c0, b_row,
                               C + r0 * c_row + c0, c_row, accumulate);
        }
    }
}

#if defined(__AVX512F__)
#define ATTN_SQUARE 16

/* dst[j * ldd + i] = src[i * lds + j] for i, j < 16, in registers: sixteen
 * rows loaded, interleaved in pairs, then in fours, then their 128-bit
 * lanes exchanged twice. */
static inline void attn_transpose_square(float *dst, size_t ldd, const float *src, size_t lds)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
        t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xdd);
        t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
        t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ldd, r[i]);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define ATTN_SQUARE 8

/* dst[j * ldd + i] = src[i * lds + j] for i, j < 8, in registers: the
 * AVX-512 square's steps at 8 lanes, whose two 128-bit lanes are
 * exchanged once. */
static inline void attn_transpose_square(float *dst, size_t ldd, const float *src, size_t lds)
{
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(r[i], r[4 + i], 0x20);
        t[4 + i] = _mm256_permute2f128_ps(r[i], r[4 + i], 0x31);
    }
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + i * ldd, t[i]);
}
#endif

/* dst[d * T_padded + t] = src[t * ld + d]: K or V of one head, transposed so
 * that a block of scores is a product with contiguous rows of B. Sixteen
 * rows of src at a time: each destination row then gets a whole cache line
 * per pass, and the sixteen source rows stay in L1 meanwhile; with AVX-512
 * or AVX2 they are transposed in registers, a 16 x 16 or 8 x 8 square at a
 * time (the element copies cost about 3 ms a step on the benchmark's
 * model). */
static inline void attn_pack_transposed(float *dst, const float *src, const attn_dims *d)
{
    for (int t0 = 0; t0 < d->T; t0 += 16) {
        int rows = d->T - t0 < 16 ? d->T - t0 : 16, j0 = 0;
        const float *s = src + t0 * d->ld;
#if defined(ATTN_SQUARE)
        for (; rows == 16 && j0 + ATTN_SQUARE <= d->HS; j0 += ATTN_SQUARE)
            for (int i0 = 0; i0 < 16; i0 += ATTN_SQUARE)
                attn_transpose_square(dst + (size_t)j0 * d->T_padded + t0 + i0,
                                      (size_t)d->T_padded, s + i0 * d->ld + j0, d->ld);
#endif
        for (int j = j0; j < d->HS; j++) {
            float *out = dst + (size_t)j * d->T_padded + t0;
            for (int i = 0; i < rows; i++) out[i] = s[i * d->ld + j];
        }
    }
}

/* Folds one row of a block of scores into that query's running softmax
 * (max m, sum l, unnormalised output acc of HS): the first `visible`
 * scores count, scaled; the row becomes probabilities relative to the new
 * maximum, zero where hidden. The loops run over the whole block width,
 * hidden entries selected away, so that they vectorise without
 * remainders. A row that sees no key is zeroed and the rest left as it
 * was: its maximum may still be -inf, and -inf - -inf would make NaNs. */
static inline void attn_softmax_row(float *row, int visible, float scale, float *m, float *l,
                                    float *acc, int HS)
{
    if (visible == 0) {
        for (int j = 0; j < ATTN_BLOCK; j++) row[j] = 0.0f;
        return;
    }
    float block_max = -INFINITY;
#pragma omp simd reduction(max : block_max)
    for (int j = 0; j < ATTN_BLOCK; j++) {
        row[j] = j < visible ? row[j] * scale : -INFINITY;
        block_max = row[j] > block_max ? row[j] : block_max;
    }
    float m_new = block_max > *m ? block_max : *m;
    float rescale = dt_fast_expf(*m - m_new);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < ATTN_BLOCK; j++) {
        row[j] = dt_fast_expf(row[j] - m_new);
        sum += row[j];
    }
    *l = *l * rescale + sum;
    *m = m_new;
    if (rescale != 1.0f) {
#pragma omp simd
        for (int j = 0; j < HS; j++) acc[j] *= rescale;
    }
}

static inline attn_dims attn_make_dims(int T, int C, int NH)
{
    attn_dims d;
    d.T = T;
    d.HS = C / NH;
    d.ld = 3 * (size_t)C;
    d.ld_out = (size_t)C;
    d.T_padded = (T + 15) / 16 * 16;
    d.scale = 1.0f / sqrtf((float)d.HS);
    return d;
}

#endif
