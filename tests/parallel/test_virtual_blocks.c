/* A job that shrank keeps the data-parallel blocks of the ranks it started
 * with (strategy.h, dt_virtual_blocks): every block is computed by one
 * rank, rank 0 a prefix, the others one each in order. The rank that hosts
 * several (the trainer's default micro-batch loop, step.c) reads exactly
 * the micro-batches their own ranks read, and forms the gradient a
 * rank-order reduction of theirs would: each micro-batch's gradient is
 * computed here alone (a step of one micro-batch, weighed as in the
 * step), and the hosted step's gradient must be their fold bit for bit,
 * in the order of the layer it serves: ranks first, then micro-batches
 * (DDP, ZeRO-1: ((g00 + g01) + (g10 + g11))), or micro-batches first
 * (ZeRO-2, whose layer reduces each; here without one, so one fold:
 * ((g00 + g10) + g01) + g11). One process, no communicator. */
#include <stdlib.h>
#include <string.h>

#include "kernels/threads.h"
#include "model/gpt.h"
#include "parallel/strategy.h"
#include "check.h"

#define MB 2
#define SEQ 16
#define VOCAB 64
#define MAX_READS 64

/* The training positions the step read, in order. */
typedef struct {
    uint64_t at[MAX_READS];
    int n;
} reads;

/* Tokens drawn from the position, so that every block's data differs. */
static int fetch(void *ctx, uint64_t first, int n, int32_t *in, int32_t *tg, char *err,
                 size_t len)
{
    (void)err, (void)len;
    reads *r = ctx;
    if (r->n < MAX_READS) r->at[r->n++] = first;
    for (int i = 0; i < n * SEQ; i++) {
        uint64_t x = (first * 2654435761u + (uint64_t)i * 40503u) ^ (first >> 3);
        in[i] = (int32_t)(x % VOCAB);
        tg[i] = (int32_t)((x / VOCAB + (uint64_t)i) % VOCAB);
    }
    return 0;
}

static void check_partition(int size, int vsize)
{
    int next = 0;
    for (int p = 0; p < size; p++) {
        int first, count;
        dt_virtual_blocks(p, size, vsize, &first, &count);
        CHECK(first == next && count == (p == 0 ? vsize - size + 1 : 1),
              "%d ranks keeping %d blocks: rank %d has blocks %d..%d, expected %d..%d", size,
              vsize, p, first, first + count - 1, next, next + (p == 0 ? vsize - size : 0));
        next = first + count;
    }
    CHECK(next == vsize, "%d ranks keeping %d blocks: %d covered", size, vsize, next);
}

typedef struct {
    dt_gpt m;
    dt_rank r;
    dt_strategy S;
    reads rd;
    int32_t in[MB * SEQ], tg[MB * SEQ];
} rig;

/* A step of `accum` micro-batches over blocks first .. first+hosted-1 of
 * a batch of `blocks` blocks (blocks x accum micro-batches of B); each
 * token weighed 1 / (B T accum scale_ranks). The gradient into g. */
static int step(rig *x, int blocks, int first, int hosted, int accum, int scale_ranks,
                int per_micro, float *g, double *loss)
{
    dt_strategy_init(&x->S, &x->r);
    x->r.accum = accum;
    x->S.dp_index = first;
    x->S.dp_hosted = hosted;
    x->S.dp_size = blocks;
    x->S.grad_ranks = scale_ranks;
    x->S.reduce_each_micro = per_micro;
    x->rd.n = 0;
    int rc = dt_step_local_grads(&x->S, 1000, loss);
    CHECK(rc == 0, "step: %s", x->r.err);
    memcpy(g, x->m.grads, x->m.n_floats * sizeof(float));
    dt_strategy_destroy(&x->S);
    return rc;
}

/* dst = src (first), else dst + src. */
static void add(float *dst, const float *src, size_t n, int first)
{
    for (size_t e = 0; e < n; e++) dst[e] = first ? src[e] : dst[e] + src[e];
}

/* What a rank-order reduction of the blocks' gradients makes of the
 * micro-batches' own (one[k accum + j]): ranks first, each block's sum
 * formed apart (blk), or micro-batches first. */
static void fold(const float *one, size_t n, int hosted, int accum, int per_micro, float *blk,
                 float *want)
{
    for (int q = 0; q < hosted * accum; q++) {
        int k = per_micro ? q % hosted : q / accum, j = per_micro ? q / hosted : q % accum;
        const float *g = one + (size_t)(k * accum + j) * n;
        if (per_micro) {
            add(want, g, n, q == 0);
            continue;
        }
        add(blk, g, n, j == 0);
        if (j == accum - 1) add(want, blk, n, k == 0);
    }
}

/* Rank 0 of `vsize` blocks on vsize - hosted + 1 ranks, with accum
 * micro-batches, in both orders. */
static void check_hosted(rig *x, int vsize, int hosted, int accum)
{
    const size_t n = x->m.n_floats;
    float *g = malloc(n * sizeof *g), *one = malloc((size_t)hosted * accum * n * sizeof *one);
    float *want = malloc(n * sizeof *want), *blk = malloc(n * sizeof *blk);
    uint64_t at[MAX_READS];
    double loss, l;
    if (!g || !one || !want || !blk) {
        CHECK(0, "out of memory");
        goto out;
    }
    /* Each micro-batch alone: block k's micro-batch j is micro-batch
     * k accum + j of a batch cut into vsize accum blocks of one. */
    for (int i = 0; i < hosted * accum; i++) {
        if (step(x, vsize * accum, i, 1, 1, vsize * accum, 0, one + (size_t)i * n, &l))
            goto out;
        at[i] = x->rd.at[0];
    }
    for (int per_micro = 0; per_micro <= 1; per_micro++) {
        check_set_label("%d blocks, rank 0 hosting %d, accum %d, %s: ", vsize, hosted, accum,
                        per_micro ? "micro-batches first" : "ranks first");
        if (step(x, vsize, 0, hosted, accum, vsize, per_micro, g, &loss)) goto out;
        CHECK(x->rd.n == hosted * accum, "%d micro-batches read", x->rd.n);
        for (int q = 0; q < x->rd.n && q < hosted * accum; q++) {
            int k = per_micro ? q % hosted : q / accum, j = per_micro ? q / hosted : q % accum;
            CHECK(x->rd.at[q] == at[k * accum + j], "read %d at %llu, block %d's micro-batch "
                  "%d is at %llu", q, (unsigned long long)x->rd.at[q], k, j,
                  (unsigned long long)at[k * accum + j]);
        }
        fold(one, n, hosted, accum, per_micro, blk, want);
        size_t bad = 0;
        for (size_t e = 0; e < n; e++) bad += memcmp(&g[e], &want[e], sizeof(float)) != 0;
        CHECK(bad == 0, "%zu of %zu gradients differ from the fold of the blocks' own", bad, n);
        CHECK(loss > 0, "loss %g", loss);
    }
out:
    check_set_label("%s", "");
    free(g), free(one), free(want), free(blk);
}

int main(void)
{
    check_partition(4, 4);
    check_partition(3, 4);
    check_partition(1, 4);
    check_partition(5, 8);
    dt_kernels_set_threads(1);
    static rig x;
    dt_gpt_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 18, .vocab_size = VOCAB,
                         .block_size = SEQ};
    char err[256];
    if (dt_gpt_create(&x.m, &cfg, DT_PREC_F32, err, sizeof err) || dt_gpt_alloc_grads(&x.m) ||
        dt_gpt_alloc_acts(&x.m, MB, SEQ)) {
        CHECK(0, "model: %s %s", err, x.m.error);
        return finish("test_virtual_blocks");
    }
    dt_gpt_init_weights(&x.m, 7);
    x.r = (dt_rank){.model = &x.m, .B = MB, .T = SEQ, .inputs = x.in, .targets = x.tg,
                    .batch = fetch, .batch_ctx = &x.rd};
    check_hosted(&x, 4, 2, 1);
    check_hosted(&x, 4, 2, 2);
    check_hosted(&x, 4, 3, 2);
    dt_gpt_destroy(&x.m);
    return finish("test_virtual_blocks");
}
