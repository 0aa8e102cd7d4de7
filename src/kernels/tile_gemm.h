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
 * element of A per row, then does up to 24 FMAs. The tile shape is made a
 * compile-time constant through a switch, so the accumulators really stay
 * in registers (measured: 6 rows 4% faster than 4).
 */
#ifndef DT_KERNELS_TILE_GEMM_H
#define DT_KERNELS_TILE_GEMM_H

#include <stddef.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define DT_TILE_ROWS 6
#define DT_TILE_COLS 64

#if defined(__AVX512F__)

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

#else /* portable: the same product as plain loops */

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
