/* Matrix products through oneDNN, in fp32 or in bf16 with fp32 accumulation.
 * Every matrix is row-major fp32 in memory; bf16 is a compute precision. */
#ifndef DT_KERNELS_MATMUL_H
#define DT_KERNELS_MATMUL_H

typedef enum { DT_PREC_F32 = 0, DT_PREC_BF16 = 1 } dt_precision;

/* C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C.
 * op(X) is X, or X transposed when transX is set: A is stored [M,K] (lda >= K)
 * or, transposed, [K,M] (lda >= M); likewise B [K,N] or [N,K].
 * With DT_PREC_BF16 the inputs are rounded to bf16 and the products are
 * accumulated in fp32 (PyTorch's bf16 autocast rounds the same inputs).
 * beta is 0 or 1 (overwrite or accumulate). M, N or K may be 0.
 * Returns 0, or -1 with a message from dt_matmul_error(). */
int dt_matmul(dt_precision prec, int transA, int transB, int M, int N, int K, float alpha,
              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
const char *dt_matmul_error(void);

/* 1 when bf16 products run on a bf16 kernel; 0 when they are emulated:
 * operands rounded to bf16 exactly as above, then multiplied and summed in
 * fp32, which gives the same products (two bf16 values multiply exactly in
 * fp32) at fp32 speed. Emulated where this CPU has no bf16 kernel
 * (oneDNN's needs AVX-512), where its fp32 FMA outruns its bf16 dot
 * products (Xeons without AMX), or under DTRAIN_BF16_EMULATE=1.
 * dt_matmul_bf16_how says which, in words ("on oneDNN's bf16 kernel").
 *
 * The path decides the products' bits, so every rank of a job must take
 * the same one. Left alone, the first bf16 product times the fp32 and bf16
 * loops (kernels/peak.h) and decides; a timing upset by a busy machine can
 * land a rank on the other side. A job decides instead: it asks whether
 * rates matter here (1: this CPU has both loops and nothing else settles
 * it), agrees on one rank's rates (FLOP/s a thread) and hands them to
 * dt_matmul_bf16_choose on every rank, before the first bf16 product.
 * DTRAIN_BF16_EMULATE still wins. Returns the path taken (1: the kernel). */
int dt_matmul_bf16_native(void);
const char *dt_matmul_bf16_how(void);
int dt_matmul_bf16_rates_matter(void);
int dt_matmul_bf16_choose(double fp32_rate, double bf16_rate);

#endif
