/*
 * Causal self-attention, forward, flash style.
 *   qkv [B, T, 3C] (q, k, v each [NH, HS] per token), out [B, T, C],
 *   lse [B, NH, T]
 * Each thread takes whole (batch, head) slices. For a block of 64 queries
 * it walks the key blocks up to the diagonal, forming 64 x 64 scores at a
 * time and keeping, per query, the running maximum m, the running sum l of
 * exp(score - m) and the unnormalised output; when m grows, l and the
 * output are rescaled by exp(m_old - m_new). At the end out = output / l
 * and lse = m + log(l) is saved for backward.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "kernels/attention.h"
#include "kernels/attention_blocks.h"
#include "kernels/fast_exp.h"
#include "kernels/profile.h"
#include "kernels/threads.h"

typedef struct {
    float *kt;     /* [HS, T_padded]: K transposed */
    float *scores; /* [ATTN_BLOCK, ATTN_BLOCK]: scores, then probabilities */
    float *acc;    /* [ATTN_BLOCK, HS]: unnormalised output of the query block */
    float *m, *l;  /* [ATTN_BLOCK] */
} forward_scratch;

static float *forward_scratch_alloc(forward_scratch *s, const attn_dims *d)
{
    size_t kt = (size_t)d->HS * d->T_padded, block = ATTN_BLOCK * ATTN_BLOCK;
    size_t acc = (size_t)ATTN_BLOCK * d->HS;
    size_t bytes = (kt + block + acc + 2 * ATTN_BLOCK) * sizeof(float);
    float *base = aligned_alloc(64, bytes);
    if (!base) return NULL;
    memset(base, 0, bytes); /* the softmax reads whole rows of scores */
    s->kt = base;
    s->scores = s->kt + kt;
    s->acc = s->scores + block;
    s->m = s->acc + acc;
    s->l = s->m + ATTN_BLOCK;
    return base;
}

/* Folds one block of scores into the running softmax of each query row
 * (attn_softmax_row); on the diagonal, row r sees keys up to its own. */
static void online_softmax(const forward_scratch *s, int bq, int bk, int diagonal, int HS,
                           float scale)
{
    for (int r = 0; r < bq; r++)
        attn_softmax_row(s->scores + r * ATTN_BLOCK, diagonal ? r + 1 : bk, scale, &s->m[r],
                         &s->l[r], s->acc + (size_t)r * HS, HS);
}

static void query_block(const forward_scratch *s, const attn_dims *d, const float *q,
                        const float *v, float *out, float *lse, int q0)
{
    int bq = d->T - q0 < ATTN_BLOCK ? d->T - q0 : ATTN_BLOCK;
    for (int r = 0; r < bq; r++) {
        s->m[r] = -INFINITY;
        s->l[r] = 0.0f;
    }
    for (size_t i = 0; i < (size_t)bq * d->HS; i++) s->acc[i] = 0.0f;
    for (int k0 = 0; k0 <= q0; k0 += ATTN_BLOCK) {
        int diagonal = k0 == q0, bk = diagonal ? bq : ATTN_BLOCK;
        attn_block_gemm(diagonal ? BLOCK_CAUSAL_WIDTH : BLOCK_FULL, bq, d->HS, bk,
                        q + q0 * d->ld, d->ld, 1, s->kt + k0, d->T_padded, s->scores, ATTN_BLOCK,
                        0);
        online_softmax(s, bq, bk, diagonal, d->HS, d->scale);
        attn_block_gemm(diagonal ? BLOCK_CAUSAL_K_END : BLOCK_FULL, bq, bk, d->HS, s->scores,
                        ATTN_BLOCK, 1, v + k0 * d->ld, d->ld, s->acc, d->HS, 1);
    }
    for (int r = 0; r < bq; r++) {
        float inv_l = 1.0f / s->l[r];
        float *o = out + (q0 + r) * d->ld_out;
        const float *acc = s->acc + (size_t)r * d->HS;
#pragma omp simd
        for (int j = 0; j < d->HS; j++) o[j] = acc[j] * inv_l;
        lse[q0 + r] = s->m[r] + logf(s->l[r]);
    }
}

static void attention_forward_body(float *out, float *lse, const float *qkv, int B, int T, int C,
                                   int NH)
{
    if (B <= 0 || T <= 0 || NH <= 0 || C <= 0) return;
    attn_dims d = attn_make_dims(T, C, NH);
    int nt = dt_kernels_threads(), failed = 0;
#pragma omp parallel num_threads(nt) reduction(| : failed)
    {
        forward_scratch s = {0};
        float *base = forward_scratch_alloc(&s, &d);
        failed = base == NULL;
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            const float *q = qkv + (size_t)b * T * d.ld + (size_t)h * d.HS;
            float *o = out + (size_t)b * T * d.ld_out + (size_t)h * d.HS;
            if (!base) {
                for (int t = 0; t < T; t++)
                    for (int j = 0; j < d.HS; j++) o[t * d.ld_out + j] = NAN;
                continue;
            }
            attn_pack_transposed(s.kt, q + C, &d);
            for (int q0 = 0; q0 < T; q0 += ATTN_BLOCK)
                query_block(&s, &d, q, q + 2 * (size_t)C, o, lse + (size_t)bh * T, q0);
        }
        free(base);
    }
    if (failed) dt_log(DT_LOG_ERROR, "attention forward: out of memory, output set to NaN");
}

void dt_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH)
{
    const uint64_t t0 = dt_prof_begin();
    attention_forward_body(out, lse, qkv, B, T, C, NH);
    dt_prof_end(DT_PROF_ATTENTION, t0, 2.0 * (double)B * T * T * C,
                4.0 * (4.0 * B * T * C + (double)B * NH * T));
}
