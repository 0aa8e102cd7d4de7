/*
 * Small matrix products for blocked kernels (attention's 64 x 64 blocks),
 * where a oneDNN call would cost more than the product itself.
 *   C[R, W] = (accumulate ? C : 0) + sum over k in [k_begin, k_end) of
 *             A[r * a_row + k * a_col] * B[k * b_row + w]
 * A is read one element at a time with any strides (so a transposed operand
 * costs nothing); B rows and C rows are contiguous runs of W floats.
 *
 * With AVX-512, C is held in registers as tiles of up to 6 rows x 64
 * columns (24 accumulators, plus 4 for B and 1 for A: 29 of the 32
 * registers): each k loads at most four vectors of B and broadcasts one
 * element of A per row, then does up to 24 FMAs. With AVX2 (16 registers
 * of 8 floats) a tile is up to 6 rows x 16 columns (12 accumulators, 2 for
 * B, 1 for A). The tile shape is made a compile-time constant through a
 * switch, so the accumulators really stay in registers (measured: 6 rows
 * 4% faster than 4). Without either, plain loops compute the same sums.
 */
#ifndef DT_KERNELS_TILE_GEMM_H
#define DT_KERNELS_TILE_GEMM_H

#include <stddef.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define DT_TILE_ROWS 6

#if defined(__AVX512F__)
#define DT_TILE_COLS 64

/* Left alone, GCC folds the loads of B into every FMA that uses them, one
 * load per FMA instead of one per vector of B: the loads then outnumber the
 * FMAs and bound the loop (measured: attention 18% slower). An empty asm
 * that claims to change the value makes the compiler keep it in a
 * register. */
#if defined(__GNUC__)
#define DT_TILE_KEEP_IN_REGISTER(x) __asm__("" : "+v"(x))
#else
#define DT_TILE_KEEP_IN_REGISTER(x) (void)0
#endif

static inline __mmask16 dt_tile_mask(int width, int vec)
{
    int left = width - 16 * vec;
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

/* One register tile: ROWS x (16 * VECS) with the last vector masked to the
 * width. ROWS and VECS are literals at every call; the unroll pragmas make
 * GCC unroll their loops early enough for acc[][] to become registers
 * (without them it stayed an array on the stack, stored every k: the
 * attention kernels ran 1.6x slower). */
static inline __attribute__((always_inline)) void
dt_tile_gemm_regs(const int ROWS, const int VECS, int k_begin, int k_end, int width,
                  const float *A, size_t a_row, size_t a_col, const float *B, size_t b_row,
                  float *C, size_t c_row, int accumulate)
{
    __m512 acc[DT_TILE_ROWS][4];
    __mmask16 last = dt_tile_mask(width, VECS - 1);
#pragma GCC unroll 6
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            __mmask16 m = v == VECS - 1 ? last : (__mmask16)0xffff;
            acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(m, C + r * c_row + 16 * v)
                                   : _mm512_setzero_ps();
        }
    for (int k = k_begin; k < k_end; k++) {
        __m512 b[4];
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            __mmask16 m = v == VECS - 1 ? last : (__mmask16)0xffff;
            b[v] = _mm512_maskz_loadu_ps(m, B + k * b_row + 16 * v);
            DT_TILE_KEEP_IN_REGISTER(b[v]);
        }
#pragma GCC unroll 6
        for (int r = 0; r < ROWS; r++) {
            __m512 a = _mm512_set1_ps(A[r * a_row + k * a_col]);
#pragma GCC unroll 4
            for (int v = 0; v < VECS; v++) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) {
            __mmask16 m = v == VECS - 1 ? last : (__mmask16)0xffff;
            _mm512_mask_storeu_ps(C + r * c_row + 16 * v, m, acc[r][v]);
        }
}

#define DT_TILE_CASE(ROWS, VECS)                                                                 \
    case (ROWS - 1) * 4 + VECS - 1:                                                              \
        dt_tile_gemm_regs(ROWS, VECS, k_begin, k_end, width, A, a_row, a_col, B, b_row, C,       \
                          c_row, accumulate);                                                    \
        break

/* rows <= DT_TILE_ROWS, 1 <= width <= DT_TILE_COLS */
static inline void dt_tile_gemm_block(int rows, int k_begin, int k_end, int width,
                                      const float *A, size_t a_row, size_t a_col, const float *B,
                                      size_t b_row, float *C, size_t c_row, int accumulate)
{
    switch ((rows - 1) * 4 + (width + 15) / 16 - 1) {
        DT_TILE_CASE(1, 1); DT_TILE_CASE(1, 2); DT_TILE_CASE(1, 3); DT_TILE_CASE(1, 4);
        DT_TILE_CASE(2, 1); DT_TILE_CASE(2, 2); DT_TILE_CASE(2, 3); DT_TILE_CASE(2, 4);
        DT_TILE_CASE(3, 1); DT_TILE_CASE(3, 2); DT_TILE_CASE(3, 3); DT_TILE_CASE(3, 4);
        DT_TILE_CASE(4, 1); DT_TILE_CASE(4, 2); DT_TILE_CASE(4, 3); DT_TILE_CASE(4, 4);
        DT_TILE_CASE(5, 1); DT_TILE_CASE(5, 2); DT_TILE_CASE(5, 3); DT_TILE_CASE(5, 4);
        DT_TILE_CASE(6, 1); DT_TILE_CASE(6, 2); DT_TILE_CASE(6, 3); DT_TILE_CASE(6, 4);
    default: break;
    }
}

#undef DT_TILE_CASE

#elif defined(__AVX2__) && defined(__FMA__)
#define DT_TILE_COLS 16

#if defined(__GNUC__)
#define DT_TILE_KEEP_IN_REGISTER(x) __asm__("" : "+x"(x))
#else
#define DT_TILE_KEEP_IN_REGISTER(x) (void)0
#endif

/* Lanes of vector vec that lie inside width: a mask for maskload/store,
 * which never touch (nor fault on) the lanes left out. */
static inline __m256i dt_tile_mask8(int width, int vec)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(width - 8 * vec),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* One register tile: ROWS x (8 * VECS); only a last vector that is not
 * full goes through the masked forms (slow stores on AMD). */
static inline __attribute__((always_inline)) void
dt_tile_gemm_regs(const int ROWS, const int VECS, int k_begin, int k_end, int width,
                  const float *A, size_t a_row, size_t a_col, const float *B, size_t b_row,
                  float *C, size_t c_row, int accumulate)
{
    __m256 acc[DT_TILE_ROWS][2];
    const int full = width == 8 * VECS;
    const __m256i last = dt_tile_mask8(width, VECS - 1);
#define DT_TILE_LOAD(p, v) (full || (v) < VECS - 1 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, last))
#pragma GCC unroll 6
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 2
        for (int v = 0; v < VECS; v++)
            acc[r][v] = accumulate ? DT_TILE_LOAD(C + r * c_row + 8 * v, v) : _mm256_setzero_ps();
    for (int k = k_begin; k < k_end; k++) {
        __m256 b[2];
#pragma GCC unroll 2
        for (int v = 0; v < VECS; v++) {
            b[v] = DT_TILE_LOAD(B + k * b_row + 8 * v, v);
            DT_TILE_KEEP_IN_REGISTER(b[v]);
        }
#pragma GCC unroll 6
        for (int r = 0; r < ROWS; r++) {
            __m256 a = _mm256_set1_ps(A[r * a_row + k * a_col]);
#pragma GCC unroll 2
            for (int v = 0; v < VECS; v++) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
        }
    }
#undef DT_TILE_LOAD
#pragma GCC unroll 6
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 2
        for (int v = 0; v < VECS; v++) {
            float *c = C + r * c_row + 8 * v;
            if (full || v < VECS - 1)
                _mm256_storeu_ps(c, acc[r][v]);
            else
                _mm256_maskstore_ps(c, last, acc[r][v]);
        }
}

#define DT_TILE_CASE(ROWS, VECS)                                                                 \
    case (ROWS - 1) * 2 + VECS - 1:                                                              \
        dt_tile_gemm_regs(ROWS, VECS, k_begin, k_end, width, A, a_row, a_col, B, b_row, C,       \
                          c_row, accumulate);                                                    \
        break

/* rows <= DT_TILE_ROWS, 1 <= width <= DT_TILE_COLS */
static inline void dt_tile_gemm_block(int rows, int k_begin, int k_end, int width,
                                      const float *A, size_t a_row, size_t a_col, const float *B,
                                      size_t b_row, float *C, size_t c_row, int accumulate)
{
    switch ((rows - 1) * 2 + (width + 7) / 8 - 1) {
        DT_TILE_CASE(1, 1); DT_TILE_CASE(1, 2); DT_TILE_CASE(2, 1); DT_TILE_CASE(2, 2);
        DT_TILE_CASE(3, 1); DT_TILE_CASE(3, 2); DT_TILE_CASE(4, 1); DT_TILE_CASE(4, 2);
        DT_TILE_CASE(5, 1); DT_TILE_CASE(5, 2); DT_TILE_CASE(6, 1); DT_TILE_CASE(6, 2);
    default: break;
    }
}

#undef DT_TILE_CASE

#else /* portable: the same product as plain loops */
#define DT_TILE_COLS 64


static inline void dt_tile_gemm_block(int rows, int k_begin, int k_end, int width,
                                      const float *A, size_t a_row, size_t a_col, const float *B,
                                      size_t b_row, float *C, size_t c_row, int accumulate)
{
    for (int r = 0; r < rows; r++) {
        float *c = C + r * c_row;
        if (!accumulate)
            for (int w = 0; w < width; w++) c[w] = 0.0f;
        for (int k = k_begin; k < k_end; k++) {
            float a = A[r * a_row + k * a_col];
            const float *b = B + k * b_row;
            for (int w = 0; w < width; w++) c[w] += a * b[w];
        }
    }
}

#endif

#endif
