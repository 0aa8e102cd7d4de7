/*
 * Kernel benchmark: dt_matmul GFLOP/s (fp32 and bf16) at 1024^3 and at the
 * GPT training shapes, then the time of every kernel at the training shape
 * (L=6, NH=6, C=384, T=256, V=256, B=8: N = B*T = 2048 rows), and from those
 * an estimate of one training step's kernel time. Rates are set against
 * this CPU's peak as MFU measures it (train/peak.h: the register-only FMA
 * loop of the ISA, or DTRAIN_PEAK_GFLOPS), never against figures from
 * another machine; PyTorch is compared in bench_train.py, in the same run.
 *
 *   bench_kernels [--threads N] [--min-seconds S]
 *
 * Each figure is the best of several timed batches (the machine is shared,
 * and the best batch is the one least disturbed), after a warm-up call that
 * also creates the matmul plan (and, for a shape this host has not timed
 * yet, chooses its fp32 path as training would: train/product_paths.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/crossentropy.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/matmul.h"
#include "kernels/optimizer.h"
#include "kernels/threads.h"
#include "model/gpt.h"
#include "train/peak.h"
#include "train/product_paths.h"

enum { L = 6, NH = 6, C = 384, T = 256, V = 256, B = 8, N = B * T };

/* This run's peak FLOP/s for fp32 and bf16 at its thread count. */
static double peak[2];

static double min_seconds = 0.3;

typedef void (*bench_fn)(void *ctx);

/* Seconds per call: the best mean over 5 batches, each at least
 * min_seconds / 5 long. */
static double time_call(bench_fn fn, void *ctx)
{
    fn(ctx);
    uint64_t t0 = dt_now_ns();
    fn(ctx);
    double once = (double)(dt_now_ns() - t0) * 1e-9;
    int reps = (int)(min_seconds / 5 / (once > 1e-7 ? once : 1e-7)) + 1;
    double best = 1e30;
    for (int batch = 0; batch < 5; batch++) {
        t0 = dt_now_ns();
        for (int r = 0; r < reps; r++) fn(ctx);
        double mean = (double)(dt_now_ns() - t0) * 1e-9 / reps;
        if (mean < best) best = mean;
    }
    return best;
}

static float *filled(size_t n, float scale)
{
    float *x = malloc(n * sizeof *x);
    uint32_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * scale;
    }
    return x;
}

/* ---- matmul ------------------------------------------------------------- */

typedef struct {
    const char *what;
    int transA, transB, M, N, K;
    float beta;
} mm_shape;

typedef struct {
    const mm_shape *s;
    dt_precision prec;
    float *A, *B, *C;
} mm_ctx;

static void run_matmul(void *arg)
{
    mm_ctx *c = arg;
    const mm_shape *s = c->s;
    int lda = s->transA ? s->M : s->K, ldb = s->transB ? s->K : s->N;
    if (dt_matmul(c->prec, s->transA, s->transB, s->M, s->N, s->K, 1.0f, c->A, lda, c->B, ldb,
                  s->beta, c->C, s->N)) {
        fprintf(stderr, "%s\n", dt_matmul_error());
        exit(1);
    }
}

static const mm_shape mm_shapes[] = {
    {"square 1024^3", 0, 0, 1024, 1024, 1024, 0},
    {"fwd qkv   inp@W", 0, 0, N, 3 * C, C, 0},
    {"fwd proj  inp@W", 0, 0, N, C, C, 0},
    {"fwd fc    inp@W", 0, 0, N, 4 * C, C, 0},
    {"fwd fcprj inp@W", 0, 0, N, C, 4 * C, 0},
    {"fwd logit inp@E^T", 0, 1, N, V, C, 0},
    {"bwd qkv   dout@W^T", 0, 1, N, C, 3 * C, 0},
    {"bwd proj  dout@W^T", 0, 1, N, C, C, 0},
    {"bwd fc    dout@W^T", 0, 1, N, C, 4 * C, 0},
    {"bwd fcprj dout@W^T", 0, 1, N, 4 * C, C, 0},
    {"bwd logit dlog@E", 0, 0, N, C, V, 0},
    {"bwd qkv   dW+=inp^T@dout", 1, 0, C, 3 * C, N, 1},
    {"bwd proj  dW+=inp^T@dout", 1, 0, C, C, N, 1},
    {"bwd fc    dW+=inp^T@dout", 1, 0, C, 4 * C, N, 1},
    {"bwd fcprj dW+=inp^T@dout", 1, 0, 4 * C, C, N, 1},
    {"bwd logit dE+=dlog^T@inp", 1, 0, V, C, N, 1},
};

static void bench_matmuls(void)
{
    printf("\n%-26s %5s %5s %5s %11s %6s %11s %6s %7s\n", "dt_matmul", "M", "N", "K", "fp32 GF/s",
           "%peak", "bf16 GF/s", "%peak", "bf16/32");
    float *A = filled((size_t)1536 * 2048, 1.0f), *Bm = filled((size_t)1536 * 2048, 1.0f);
    float *Cm = filled((size_t)1536 * 2048, 1.0f);
    for (size_t i = 0; i < sizeof mm_shapes / sizeof mm_shapes[0]; i++) {
        const mm_shape *s = &mm_shapes[i];
        double flops = 2.0 * s->M * s->N * s->K, gf[2];
        for (int p = 0; p < 2; p++) {
            mm_ctx c = {s, p ? DT_PREC_BF16 : DT_PREC_F32, A, Bm, Cm};
            gf[p] = flops / time_call(run_matmul, &c) * 1e-9;
        }
        printf("%-26s %5d %5d %5d %11.1f %5.0f%% %11.1f %5.0f%% %7.2f\n", s->what, s->M, s->N,
               s->K, gf[0], 100 * gf[0] * 1e9 / peak[0], gf[1], 100 * gf[1] * 1e9 / peak[1],
               gf[1] / gf[0]);
    }
    free(A), free(Bm), free(Cm);
}

/* ---- the other kernels at the training shape ---------------------------- */

typedef struct {
    dt_precision prec;
    float *x, *y, *z, *w, *b, *dw, *db, *mean, *rstd, *qkv, *dqkv, *att, *datt, *lse;
    float *p, *g, *m, *v;
    uint16_t *h16;
    int32_t *tokens;
    int lin_in, lin_out;
} ctx_t;

static void k_layernorm_fwd(void *a)
{
    ctx_t *c = a;
    dt_layernorm_forward(c->y, c->mean, c->rstd, c->x, c->w, c->b, 1e-5f, N, C);
}
static void k_layernorm_bwd(void *a)
{
    ctx_t *c = a;
    dt_layernorm_backward(c->z, c->dw, c->db, c->y, c->x, c->w, c->mean, c->rstd, N, C);
}
static void k_linear_fwd(void *a)
{
    ctx_t *c = a;
    dt_linear_forward(c->prec, c->y, c->x, c->w, c->b, N, c->lin_in, c->lin_out);
}
/* c_fc and the two projections: their biases go in with the pass after
 * them (GELU; the residual's add), as training adds them */
static void k_linear_fwd_no_bias(void *a)
{
    ctx_t *c = a;
    dt_linear_forward(c->prec, c->y, c->x, c->w, NULL, N, c->lin_in, c->lin_out);
}
static void k_linear_bwd(void *a)
{
    ctx_t *c = a;
    dt_linear_backward(c->prec, c->z, 0, c->dw, c->db, c->y, c->x, c->w, N, c->lin_in,
                       c->lin_out);
}
static void k_attention_fwd(void *a)
{
    ctx_t *c = a;
    dt_attention_forward(c->att, c->lse, c->qkv, B, T, C, NH);
}
static void k_attention_bwd(void *a)
{
    ctx_t *c = a;
    dt_attention_backward(c->dqkv, c->datt, c->qkv, c->att, c->lse, B, T, C, NH);
}
static void k_gelu_fwd(void *a)
{
    ctx_t *c = a;
    dt_gelu_bias_forward(c->y, c->x, c->b, N, 4 * C);
}
static void k_gelu_bwd(void *a)
{
    ctx_t *c = a;
    dt_gelu_bias_backward(c->z, c->x, c->b, c->y, N, 4 * C);
}
static void k_bias_residual(void *a)
{
    ctx_t *c = a;
    dt_linear_bias_residual(c->y, c->x, c->b, c->z, N, C);
}
static void k_crossentropy(void *a)
{
    ctx_t *c = a;
    dt_crossentropy(c->z, c->mean, c->x, c->tokens, N, V, 1.0f / N);
}
static void k_embedding_fwd(void *a)
{
    ctx_t *c = a;
    dt_embedding_forward(c->y, c->tokens, c->w, c->b, B, T, C);
}
static void k_embedding_bwd(void *a)
{
    ctx_t *c = a;
    dt_embedding_backward(c->dw, c->db, c->x, c->tokens, B, T, C);
}

#define N_PARAMS ((size_t)V * C + (size_t)T * C + (size_t)L * (12 * C * C + 13 * C) + 2 * C)

static void k_adamw(void *a)
{
    ctx_t *c = a;
    dt_adamw_update(c->p, c->g, c->m, c->v, N_PARAMS, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f);
}
static void k_sum_squares(void *a)
{
    ctx_t *c = a;
    volatile double s = dt_sum_squares(c->g, N_PARAMS);
    (void)s;
}
static void k_cast(void *a)
{
    ctx_t *c = a;
    dt_cast_f32_to_bf16(c->h16, c->x, (size_t)N * 4 * C);
}

typedef struct {
    const char *name;
    bench_fn fn;
    int in, out;       /* linear sizes, 0 otherwise */
    int per_step;      /* calls in one training step (forward + backward + update) */
    int matmul_bound;  /* whose time depends on the precision */
} kernel_entry;

static const kernel_entry kernels[] = {
    {"embedding fwd", k_embedding_fwd, 0, 0, 1, 0},
    {"layernorm fwd", k_layernorm_fwd, 0, 0, 2 * L + 1, 0},
    {"linear fwd qkv", k_linear_fwd, C, 3 * C, L, 1},
    {"attention fwd", k_attention_fwd, 0, 0, L, 0},
    {"linear fwd proj", k_linear_fwd_no_bias, C, C, L, 1},
    {"linear fwd fc", k_linear_fwd_no_bias, C, 4 * C, L, 1},
    {"gelu fwd (+ c_fc bias)", k_gelu_fwd, 0, 0, L, 0},
    {"linear fwd fcproj", k_linear_fwd_no_bias, 4 * C, C, L, 1},
    {"bias + residual", k_bias_residual, 0, 0, 2 * L, 0},
    {"linear fwd logits", k_linear_fwd, C, V, 1, 1},
    {"crossentropy fwd+bwd", k_crossentropy, 0, 0, 1, 0},
    {"linear bwd logits", k_linear_bwd, C, V, 1, 1},
    {"linear bwd fcproj", k_linear_bwd, 4 * C, C, L, 1},
    {"gelu bwd (+ c_fc bias)", k_gelu_bwd, 0, 0, L, 0},
    {"linear bwd fc", k_linear_bwd, C, 4 * C, L, 1},
    {"layernorm bwd", k_layernorm_bwd, 0, 0, 2 * L + 1, 0},
    {"linear bwd proj", k_linear_bwd, C, C, L, 1},
    {"attention bwd", k_attention_bwd, 0, 0, L, 0},
    {"linear bwd qkv", k_linear_bwd, C, 3 * C, L, 1},
    {"embedding bwd", k_embedding_bwd, 0, 0, 1, 0},
    {"sum_squares (grad norm)", k_sum_squares, 0, 0, 1, 0},
    {"adamw (all params)", k_adamw, 0, 0, 1, 0},
    {"cast f32->bf16 N x 4C", k_cast, 0, 0, 0, 0},
};

static void ctx_init(ctx_t *c)
{
    size_t big = (size_t)N * 4 * C;
    c->x = filled(big, 2.0f), c->y = filled(big, 1.0f), c->z = filled(big, 1.0f);
    c->w = filled((size_t)4 * C * C, 0.1f), c->b = filled((size_t)4 * C * C, 0.1f);
    c->dw = filled((size_t)4 * C * C, 0.1f), c->db = filled((size_t)4 * C * C, 0.1f);
    c->mean = filled(N, 0.1f), c->rstd = filled(N, 1.0f);
    c->qkv = filled((size_t)N * 3 * C, 1.0f), c->dqkv = filled((size_t)N * 3 * C, 1.0f);
    c->att = filled((size_t)N * C, 1.0f), c->datt = filled((size_t)N * C, 1.0f);
    c->lse = filled((size_t)B * NH * T, 1.0f);
    c->p = filled(N_PARAMS, 0.1f), c->g = filled(N_PARAMS, 0.01f);
    c->m = filled(N_PARAMS, 0.001f), c->v = filled(N_PARAMS, 0.0f);
    for (size_t i = 0; i < N_PARAMS; i++) c->v[i] *= c->v[i];
    c->h16 = malloc(big * sizeof *c->h16);
    c->tokens = malloc(N * sizeof *c->tokens);
    for (int i = 0; i < N; i++) c->tokens[i] = (i * 37 + 11) % V;
    dt_layernorm_forward(c->y, c->mean, c->rstd, c->x, c->w, c->b, 1e-5f, N, C);
    dt_attention_forward(c->att, c->lse, c->qkv, B, T, C, NH);
}

static void bench_kernels(void)
{
    ctx_t c;
    ctx_init(&c);
    printf("\n%-26s %10s %10s %8s\n", "kernel (training shape)", "fp32 ms", "bf16 ms", "/step");
    double step[2] = {0, 0};
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
        const kernel_entry *k = &kernels[i];
        double ms[2];
        for (int p = 0; p < 2; p++) {
            c.prec = p ? DT_PREC_BF16 : DT_PREC_F32;
            c.lin_in = k->in, c.lin_out = k->out;
            ms[p] = p && !k->matmul_bound ? ms[0] : time_call(k->fn, &c) * 1e3;
            step[p] += ms[p] * k->per_step;
        }
        if (k->matmul_bound)
            printf("%-26s %10.3f %10.3f %8d\n", k->name, ms[0], ms[1], k->per_step);
        else
            printf("%-26s %10.3f %10s %8d\n", k->name, ms[0], "", k->per_step);
    }
    /* in-cache times: a real step also pays for the model's own passes and
     * for activations that come from memory */
    printf("%-26s %10.1f %10.1f   (kernel time x calls per step)\n", "step estimate, ms", step[0],
           step[1]);
    double tps[2] = {N / step[0] * 1e3, N / step[1] * 1e3};
    printf("%-26s %10.0f %10.0f\n", "=> tokens/s", tps[0], tps[1]);
    dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C, .block_size = T, .vocab_size = V};
    double flops_tok = dt_gpt_flops_per_token(&cfg, T);
    printf("%-26s %9.1f%% %9.1f%%   (of the peak above: %.0f FLOPs per token)\n", "   MFU",
           100 * tps[0] * flops_tok / peak[0], 100 * tps[1] * flops_tok / peak[1], flops_tok);
}

int main(int argc, char **argv)
{
    int threads = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-seconds") && i + 1 < argc) min_seconds = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--threads N] [--min-seconds S]\n", argv[0]);
            return 2;
        }
    }
    dt_kernels_set_threads(threads);
    printf("bench_kernels: %d thread(s)\n", threads);
    for (int p = 0; p < 2; p++) {
        char desc[512];
        if (dt_mfu_peak(threads, 1, p, &peak[p], desc, sizeof desc) != 0 || peak[p] <= 0) {
            fprintf(stderr, "bench_kernels: no peak to measure against: %s\n", desc);
            return 1;
        }
        printf("%s: %s\n", p ? "bf16" : "fp32", desc);
    }
    char paths[4200], err[512];
    if (dt_product_paths_start(paths, sizeof paths, err, sizeof err) != 0) {
        fprintf(stderr, "bench_kernels: %s\n", err);
        return 1;
    }
    printf("fp32 products: oneDNN's path per shape as training takes it, from %s "
           "(timed on first use where it has none; DTRAIN_MATMUL_PATHS=rule for the fixed rule)\n",
           paths);
    bench_matmuls();
    bench_kernels();
    return 0;
}
