/* The general product behind dt_matmul, for kernels that need more than it
 * offers: a bias row fused into the product, or operands already rounded to
 * bf16 (so that one cast serves several products).
 *   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + bias[N] (each row) + beta * C
 * Layouts and transposes as in dt_matmul. Each operand is given either as
 * fp32 (A, B) or, with DT_PREC_BF16 only, as bf16 (A16, B16; the fp32
 * pointer is then NULL). bias may be NULL; with a bias alpha must be 1. */
#ifndef DT_KERNELS_MATMUL_PROBLEM_H
#define DT_KERNELS_MATMUL_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/matmul.h"

typedef struct {
    dt_precision prec;
    int transA, transB;
    int M, N, K;
    float alpha, beta;
    const float *A, *B;
    const uint16_t *A16, *B16;
    int lda, ldb, ldc;
    const float *bias;
    float *C;
} dt_matmul_problem;

/* Returns 0, or -1 with a message from dt_matmul_error(). */
int dt_matmul_solve(const dt_matmul_problem *p);

/* Rounds a stored matrix (rows x cols, row stride ld) to bf16, packed
 * (row stride cols), with the kernel threads. */
void dt_matmul_round_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld);

/* A bf16 buffer of the calling thread for an operand rounded once and used
 * by several products (dt_matmul_solve never touches it). It stays valid
 * until the next call from the same thread; NULL when memory runs out. */
uint16_t *dt_matmul_bf16_buffer(size_t elems);

#endif
