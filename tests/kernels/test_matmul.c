/*
 * dt_matmul against a double-precision triple loop: every transpose
 * combination, padded leading dimensions, alpha and beta, odd and degenerate
 * sizes, fp32 and bf16 (whose reference multiplies the bf16-rounded inputs),
 * one and two threads, accumulation that adds the whole product, calls
 * from two threads at once, a full plan table,
 * and the errors.
 */
#include <pthread.h>

#include "bf16_ref.h"
#include "kernel_test.h"
#include "kernels/matmul.h"
#include "kernels/threads.h"

typedef struct {
    int transA, transB, M, N, K, lda, ldb, ldc;
    float alpha, beta;
} problem;

static int stored_rows(int trans, int rows, int cols) { return trans ? cols : rows; }

/* C = alpha op(A) op(B) + beta C, in double */
static void reference(const problem *p, const float *A, const float *B, const float *C0,
                      double *C)
{
    for (int i = 0; i < p->M; i++)
        for (int j = 0; j < p->N; j++) {
            double sum = 0.0;
            for (int k = 0; k < p->K; k++) {
                float a = p->transA ? A[(size_t)k * p->lda + i] : A[(size_t)i * p->lda + k];
                float b = p->transB ? B[(size_t)j * p->ldb + k] : B[(size_t)k * p->ldb + j];
                sum += (double)a * b;
            }
            double c0 = p->beta != 0.0f ? (double)p->beta * C0[(size_t)i * p->ldc + j] : 0.0;
            C[(size_t)i * p->N + j] = p->alpha * sum + c0;
        }
}

/* Runs one problem and compares the M x N result; returns the error. */
static double run_problem(const problem *p, dt_precision prec, int round_ref)
{
    size_t a_n = (size_t)stored_rows(p->transA, p->M, p->K) * p->lda;
    size_t b_n = (size_t)stored_rows(p->transB, p->K, p->N) * p->ldb;
    size_t c_n = (size_t)p->M * p->ldc;
    float *A = rnd_array(a_n, 1.0f), *B = rnd_array(b_n, 1.0f), *C = rnd_array(c_n, 1.0f);
    /* with beta 0, C must be overwritten: NaN there must not leak through */
    if (p->beta == 0.0f)
        for (size_t i = 0; i < c_n; i++) C[i] = NAN;
    float *C0 = fcopy(C, c_n), *got = malloc(((size_t)p->M * p->N + 1) * sizeof *got);
    double *want = dalloc((size_t)p->M * p->N);
    float *A_ref = fcopy(A, a_n), *B_ref = fcopy(B, b_n);
    for (size_t i = 0; round_ref && i < a_n; i++) A_ref[i] = ref_bf16_round(A[i]);
    for (size_t i = 0; round_ref && i < b_n; i++) B_ref[i] = ref_bf16_round(B[i]);
    reference(p, A_ref, B_ref, C0, want);
    free(A_ref), free(B_ref);
    int rc = dt_matmul(prec, p->transA, p->transB, p->M, p->N, p->K, p->alpha, A, p->lda, B,
                       p->ldb, p->beta, C, p->ldc);
    CHECK(rc == 0, "dt_matmul failed: %s", dt_matmul_error());
    for (int i = 0; i < p->M; i++) {
        memcpy(got + (size_t)i * p->N, C + (size_t)i * p->ldc, (size_t)p->N * sizeof *got);
        for (int j = p->N; j < p->ldc; j++) /* padding between rows is not C's */
            CHECK(bits_equal(&C[(size_t)i * p->ldc + j], &C0[(size_t)i * p->ldc + j], 1),
                  "padding of row %d changed", i);
    }
    double err = rel_error(got, want, (size_t)p->M * p->N);
    free(A), free(B), free(C), free(C0), free(got), free(want);
    return err;
}

static const int shapes[][3] = {{1, 1, 1},     {1, 7, 3},     {5, 1, 9},   {3, 4, 1},
                                {17, 33, 15},  {64, 64, 64},  {65, 48, 17}, {100, 37, 129},
                                {256, 300, 200}, {31, 257, 384}};

static void check_shapes(dt_precision prec)
{
    int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    for (int s = 0; s < n_shapes; s++)
        for (int variant = 0; variant < 8; variant++) {
            problem p = {variant & 1, (variant >> 1) & 1, shapes[s][0], shapes[s][1], shapes[s][2],
                         0, 0, 0, 1.0f, 0.0f};
            int pad = (variant >> 2) & 1 ? 3 : 0;
            p.lda = (p.transA ? p.M : p.K) + pad;
            p.ldb = (p.transB ? p.K : p.N) + pad;
            p.ldc = p.N + pad;
            p.beta = (float)(s % 2);
            p.alpha = s % 3 == 2 ? 0.5f : 1.0f;
            double err = run_problem(&p, prec, prec == DT_PREC_BF16);
            CHECK(err <= 1e-5, "%s M=%d N=%d K=%d tA=%d tB=%d pad=%d beta=%g: error %.3g",
                  prec == DT_PREC_BF16 ? "bf16" : "fp32", p.M, p.N, p.K, p.transA, p.transB, pad,
                  p.beta, err);
        }
}

/* bf16 must really round: against the unrounded reference the error is of
 * the order of bf16's precision, far above fp32's. */
static void check_bf16_rounds(void)
{
    problem p = {0, 0, 64, 64, 256, 256, 64, 64, 1.0f, 0.0f};
    double err = run_problem(&p, DT_PREC_BF16, 0);
    CHECK(err > 1e-4 && err < 2e-2, "bf16 against the fp32 reference: error %.3g", err);
}

static void check_degenerate(void)
{
    float A[4] = {1, 2, 3, 4}, B[4] = {1, 2, 3, 4}, C[4] = {5, 6, 7, 8};
    CHECK(dt_matmul(DT_PREC_F32, 0, 0, 0, 2, 2, 1.0f, A, 2, B, 2, 0.0f, C, 2) == 0, "M=0");
    CHECK(dt_matmul(DT_PREC_F32, 0, 0, 2, 0, 2, 1.0f, A, 2, B, 1, 0.0f, C, 1) == 0, "N=0");
    CHECK(C[0] == 5 && C[3] == 8, "M=0 or N=0 wrote C");
    CHECK(dt_matmul(DT_PREC_BF16, 0, 0, 2, 2, 0, 1.0f, A, 1, B, 2, 1.0f, C, 2) == 0, "K=0");
    CHECK(C[0] == 5 && C[3] == 8, "K=0, beta=1 changed C");
    CHECK(dt_matmul(DT_PREC_F32, 0, 0, 2, 2, 0, 1.0f, A, 1, B, 2, 0.0f, C, 2) == 0, "K=0");
    CHECK(C[0] == 0 && C[1] == 0 && C[2] == 0 && C[3] == 0, "K=0, beta=0 left C");
}

static void check_errors(void)
{
    float A[8] = {0}, B[8] = {0}, C[8] = {0};
    CHECK(dt_matmul(DT_PREC_F32, 0, 0, 2, 2, 3, 1.0f, A, 2, B, 2, 0.0f, C, 2) == -1,
          "lda < K accepted");
    CHECK(strstr(dt_matmul_error(), "K=3") && strstr(dt_matmul_error(), "leading"),
          "message does not name the shape and the fault: %s", dt_matmul_error());
    CHECK(dt_matmul(DT_PREC_F32, 0, 0, -1, 2, 2, 1.0f, A, 2, B, 2, 0.0f, C, 2) == -1,
          "negative M accepted");
    CHECK(dt_matmul(DT_PREC_F32, 0, 0, 2, 2, 2, 1.0f, NULL, 2, B, 2, 0.0f, C, 2) == -1,
          "NULL A accepted");
    CHECK(dt_matmul((dt_precision)7, 0, 0, 2, 2, 2, 1.0f, A, 2, B, 2, 0.0f, C, 2) == -1,
          "unknown precision accepted");
}

/* Same inputs, same bits: twice in a row, and from a cached plan with
 * different buffers. */
static void check_repeatable(void)
{
    int M = 96, N = 80, K = 72;
    float *A = rnd_array((size_t)M * K, 1.0f), *B = rnd_array((size_t)K * N, 1.0f);
    float *C1 = calloc((size_t)M * N, sizeof *C1), *C2 = calloc((size_t)M * N, sizeof *C2);
    float *A2 = fcopy(A, (size_t)M * K);
    dt_matmul(DT_PREC_F32, 0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C1, N);
    dt_matmul(DT_PREC_F32, 0, 0, M, N, K, 1.0f, A2, K, B, N, 0.0f, C2, N);
    CHECK(bits_equal(C1, C2, (size_t)M * N), "same product, different bits");
    free(A), free(A2), free(B), free(C1), free(C2);
}

/* beta = 1 adds the whole product to C: C + (A @ B), bit for bit the sum of
 * C and the beta = 0 product. DDP's weight gradients equal one process's
 * with accumulation only if this holds (each rank forms its product alone,
 * the all-reduce adds them). K = 900 spans several of a GEMM's K blocks,
 * and M x N = 4300 x 1000 more than one block of rows; the variants are
 * forward (no transpose), the weight gradient (A transposed) and B
 * transposed with N > K. */
static void check_accumulate_whole(void)
{
    int M = 4300, N = 1000, K = 900;
    for (int variant = 0; variant < 3; variant++) {
        int tA = variant == 1, tB = variant == 2, ldc = N + 5;
        float *A = rnd_array((size_t)M * K, 1.0f), *B = rnd_array((size_t)K * N, 1.0f);
        float *C = rnd_array((size_t)M * ldc, 1.0f), *C0 = fcopy(C, (size_t)M * ldc);
        float *P = malloc((size_t)M * N * sizeof *P);
        int lda = tA ? M : K, ldb = tB ? K : N, bad = 0;
        CHECK(dt_matmul(DT_PREC_F32, tA, tB, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, P, N) == 0 &&
                  dt_matmul(DT_PREC_F32, tA, tB, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc) == 0,
              "dt_matmul failed: %s", dt_matmul_error());
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float want = C0[(size_t)i * ldc + j] + P[(size_t)i * N + j];
                bad += !bits_equal(&C[(size_t)i * ldc + j], &want, 1);
            }
        CHECK(bad == 0, "tA=%d tB=%d: %d of %d elements of C += A @ B are not C + (A @ B)", tA,
              tB, bad, M * N);
        free(A), free(B), free(C), free(C0), free(P);
    }
}

typedef struct {
    int seed, errors;
} worker_arg;

static void *worker(void *arg)
{
    worker_arg *w = arg;
    int M = 50 + w->seed, N = 40, K = 60;
    float *A = malloc((size_t)M * K * sizeof *A), *B = malloc((size_t)K * N * sizeof *B);
    float *C = malloc((size_t)M * N * sizeof *C);
    for (int i = 0; i < M * K; i++) A[i] = (float)((i * 7 + w->seed) % 13) - 6.0f;
    for (int i = 0; i < K * N; i++) B[i] = (float)((i * 5 + w->seed) % 11) - 5.0f;
    for (int rep = 0; rep < 50; rep++) {
        dt_precision prec = rep % 2 ? DT_PREC_BF16 : DT_PREC_F32; /* small integers: exact */
        if (dt_matmul(prec, 0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N)) w->errors++;
        for (int i = 0; i < M; i += 7)
            for (int j = 0; j < N; j += 3) {
                double s = 0;
                for (int k = 0; k < K; k++) s += (double)A[i * K + k] * B[k * N + j];
                if ((double)C[i * N + j] != s) w->errors++;
            }
    }
    free(A), free(B), free(C);
    return NULL;
}

static void check_concurrent_callers(void)
{
    pthread_t th[2];
    worker_arg args[2] = {{1, 0}, {2, 0}};
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, worker, &args[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK(args[0].errors == 0 && args[1].errors == 0, "concurrent callers: %d and %d errors",
          args[0].errors, args[1].errors);
}

/* More distinct shapes than the plan table holds: later ones still work. */
static void check_many_shapes(void)
{
    float A[600 * 2], B[2 * 3], C[600 * 3];
    for (int i = 0; i < 1200; i++) A[i] = (float)(i % 5);
    for (int i = 0; i < 6; i++) B[i] = (float)i;
    int bad = 0;
    for (int M = 1; M <= 600; M++) {
        if (dt_matmul(DT_PREC_F32, 0, 0, M, 3, 2, 1.0f, A, 2, B, 3, 0.0f, C, 3)) bad++;
        int i = M - 1;
        for (int j = 0; j < 3; j++)
            if (C[i * 3 + j] != A[i * 2] * B[j] + A[i * 2 + 1] * B[3 + j]) bad++;
    }
    CHECK(bad == 0, "%d errors over 600 distinct shapes", bad);
}

int main(void)
{
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        check_shapes(DT_PREC_F32);
        check_shapes(DT_PREC_BF16);
    }
    check_bf16_rounds();
    check_degenerate();
    check_errors();
    check_repeatable();
    check_accumulate_whole();
    check_concurrent_callers();
    check_many_shapes();
    return finish("test_matmul");
}
