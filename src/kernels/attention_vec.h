/*
 * The vector the attention tiles (attention_tiles.h) are written in, so
 * that one text of the tiles serves both widths: 16 floats with AVX-512,
 * 8 with AVX2 + FMA, chosen at compile time as tile_gemm.h chooses its
 * tiles. Without either, ATTN_LANES stays undefined and the kernels use
 * their plain loops.
 *
 * attn_lanes selects lanes: a bit mask with AVX-512, a vector of all-ones
 * or zero lanes with AVX2. ATTN_TILE_VECS is how many vectors of keys a
 * register tile holds per row next to its 6 rows: 4 with 32 registers (64
 * keys, a whole block), 2 with 16 (16 keys), as in tile_gemm.h.
 */
#ifndef DT_KERNELS_ATTENTION_VEC_H
#define DT_KERNELS_ATTENTION_VEC_H

#include "kernels/fast_exp.h"
#include "kernels/tile_gemm.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#define ATTN_LANES 16
#define ATTN_TILE_VECS 4

typedef __m512 attn_vec;
typedef __mmask16 attn_lanes;

static inline attn_vec attn_vec_zero(void) { return _mm512_setzero_ps(); }
static inline attn_vec attn_vec_set1(float x) { return _mm512_set1_ps(x); }
static inline attn_vec attn_vec_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void attn_vec_store(float *p, attn_vec x) { _mm512_storeu_ps(p, x); }
static inline attn_vec attn_vec_add(attn_vec a, attn_vec b) { return _mm512_add_ps(a, b); }
static inline attn_vec attn_vec_sub(attn_vec a, attn_vec b) { return _mm512_sub_ps(a, b); }
static inline attn_vec attn_vec_mul(attn_vec a, attn_vec b) { return _mm512_mul_ps(a, b); }
static inline attn_vec attn_vec_max(attn_vec a, attn_vec b) { return _mm512_max_ps(a, b); }
static inline attn_vec attn_vec_fmadd(attn_vec a, attn_vec b, attn_vec c)
{
    return _mm512_fmadd_ps(a, b, c);
}
static inline attn_vec attn_vec_fmsub(attn_vec a, attn_vec b, attn_vec c)
{
    return _mm512_fmsub_ps(a, b, c);
}
static inline attn_vec attn_vec_exp2(attn_vec x) { return dt_fast_exp2_512(x); }
static inline float attn_vec_reduce_max(attn_vec x) { return _mm512_reduce_max_ps(x); }
static inline float attn_vec_reduce_add(attn_vec x) { return _mm512_reduce_add_ps(x); }

/* Lanes of vector v (keys 16 v ...) that lie below `visible`. */
static inline attn_lanes attn_vec_lanes(int visible, int v)
{
    int left = visible - 16 * v;
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
}

/* x where m selects, otherwise `other` */
static inline attn_vec attn_vec_select(attn_lanes m, attn_vec x, attn_vec other)
{
    return _mm512_mask_blend_ps(m, other, x);
}

static inline attn_vec attn_vec_select_or_zero(attn_lanes m, attn_vec x)
{
    return _mm512_maskz_mov_ps(m, x);
}

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define ATTN_LANES 8
#define ATTN_TILE_VECS 2

typedef __m256 attn_vec;
typedef __m256 attn_lanes;

static inline attn_vec attn_vec_zero(void) { return _mm256_setzero_ps(); }
static inline attn_vec attn_vec_set1(float x) { return _mm256_set1_ps(x); }
static inline attn_vec attn_vec_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void attn_vec_store(float *p, attn_vec x) { _mm256_storeu_ps(p, x); }
static inline attn_vec attn_vec_add(attn_vec a, attn_vec b) { return _mm256_add_ps(a, b); }
static inline attn_vec attn_vec_sub(attn_vec a, attn_vec b) { return _mm256_sub_ps(a, b); }
static inline attn_vec attn_vec_mul(attn_vec a, attn_vec b) { return _mm256_mul_ps(a, b); }
static inline attn_vec attn_vec_max(attn_vec a, attn_vec b) { return _mm256_max_ps(a, b); }
static inline attn_vec attn_vec_fmadd(attn_vec a, attn_vec b, attn_vec c)
{
    return _mm256_fmadd_ps(a, b, c);
}
static inline attn_vec attn_vec_fmsub(attn_vec a, attn_vec b, attn_vec c)
{
    return _mm256_fmsub_ps(a, b, c);
}
static inline attn_vec attn_vec_exp2(attn_vec x) { return dt_fast_exp2_256(x); }

static inline float attn_vec_reduce_max(attn_vec x)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float attn_vec_reduce_add(attn_vec x)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Lanes of vector v (keys 8 v ...) that lie below `visible`. */
static inline attn_lanes attn_vec_lanes(int visible, int v)
{
    return _mm256_castsi256_ps(dt_tile_mask8(visible, v));
}

/* x where m selects, otherwise `other` */
static inline attn_vec attn_vec_select(attn_lanes m, attn_vec x, attn_vec other)
{
    return _mm256_blendv_ps(other, x, m);
}

static inline attn_vec attn_vec_select_or_zero(attn_lanes m, attn_vec x)
{
    return _mm256_and_ps(m, x);
}
#endif

#endif
