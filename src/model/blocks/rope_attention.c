/* The Llama family's causal self-attention as a block kind: q_proj [C, C],
 * k_proj and v_proj [KV D, C], o_proj [C, C] (torch's Linear layout, no
 * biases; D = C / NH), rotary positions on the queries and keys, and
 * grouped-query attention: query head h reads key/value head h / (NH /
 * KV), consecutive heads sharing one (Hugging Face's repeat_kv).
 *
 * The attention itself is GPT-2's kernels' (alone, or over the context-
 * parallel group through dt_gpt_cp's hooks): each key/value head is
 * repeated into the packed [N, 3A] rows they read, and backward sums the
 * group's gradients back into its one head. A token's rotation uses its
 * position in the whole sequence, so a context-parallel rank turns its
 * rows by the positions it holds (zig-zag included).
 *
 * Tensor parallelism (Megatron's): q, k and v column-parallel (this rank's
 * NH / tp query heads with their KV / tp key/value heads: whole groups),
 * o_proj row-parallel. q, k and v are one product when their tensors lie
 * one after another (dt_model_group), into proj's rows [q | k | v].
 * Buffers, N rows of the micro-batch (R between the products), A = C / tp,
 * Ak = KV D / tp, W = A + 2 Ak:
 *   res [R, C]      the residual sum after it                  PRODUCT
 *   qkv [N, 3A]     q, k, v turned and repeated, as attention reads them
 *                                                             PRODUCT
 *   att [N, A]      the heads' output                          PRODUCT
 *   lse [S N]       what attention keeps                       PRODUCT
 *   d_proj [N, C], d_qkv [N, W]                                SPLIT
 *   dqkv [N, 3A], proj [N, W] (the products' outputs, then their
 *   gradients), pos [N]                                        SCRATCH */
#include <string.h>

#include "kernels/rope.h"
#include "model/model_internal.h"

enum { RES, QKV, ATT, LSE, D_PROJ, D_QKV, DQKV, PROJ, POS, N_ACTS };
enum { Q_W, K_W, V_W, O_W };

static int head_dim(const dt_gpt_config *cfg) { return cfg->n_embd / cfg->n_head; }

static int tensors(const dt_gpt_config *cfg, const dt_gpt_tp *tp, const dt_gpt_ep *ep,
                   dt_tensor_spec *out)
{
    (void)ep;
    const int C = cfg->n_embd, KD = dt_gpt_kv_heads(cfg) * head_dim(cfg);
    const int split = tp && tp->size > 1, r = split ? tp->rank : 0;
    out[Q_W] = (dt_tensor_spec){"q_proj.weight", C, C, {0}, DT_INIT_NORMAL, 0, 0};
    out[K_W] = (dt_tensor_spec){"k_proj.weight", KD, C, {0}, DT_INIT_NORMAL, 0, 0};
    out[V_W] = (dt_tensor_spec){"v_proj.weight", KD, C, {0}, DT_INIT_NORMAL, 0, 0};
    out[O_W] = (dt_tensor_spec){"o_proj.weight", C, C, {0}, DT_INIT_RESIDUAL, 0, 0};
    if (split) { /* this rank's heads: their rows of q, k, v; their columns of o */
        const int A = tp->attn, Ak = KD / tp->size;
        out[Q_W].slice = (dt_slice){r * A, A, 1, 0, 0, C};
        out[K_W].slice = out[V_W].slice = (dt_slice){r * Ak, Ak, 1, 0, 0, C};
        out[O_W].slice = (dt_slice){0, C, 1, r * A, 0, A};
    }
    return 4;
}

/* This rank's key/value width: its kv heads x D. */
static int kv_width(const dt_gpt *m) { return m->tp.kv_heads * head_dim(&m->cfg); }

/* proj's width: q's, k's and v's columns. */
static int proj_width(const dt_gpt *m) { return m->tp.attn + 2 * kv_width(m); }

static int acts(const dt_gpt *m, size_t N, size_t R, dt_act_spec *out)
{
    const size_t C = (size_t)m->cfg.n_embd, A = (size_t)m->tp.attn, W = (size_t)proj_width(m);
    const size_t S = (size_t)m->tp.heads + (size_t)m->cp.saved_widths * A;
    out[RES] = (dt_act_spec){R * C, DT_ACT_PRODUCT};
    out[QKV] = (dt_act_spec){N * 3 * A, DT_ACT_PRODUCT};
    out[ATT] = (dt_act_spec){N * A, DT_ACT_PRODUCT};
    out[LSE] = (dt_act_spec){S * N, DT_ACT_PRODUCT};
    out[D_PROJ] = (dt_act_spec){N * C, DT_ACT_SPLIT};
    out[D_QKV] = (dt_act_spec){N * W, DT_ACT_SPLIT};
    out[DQKV] = (dt_act_spec){N * 3 * A, DT_ACT_SCRATCH};
    out[PROJ] = (dt_act_spec){N * W, DT_ACT_SCRATCH};
    out[POS] = (dt_act_spec){N, DT_ACT_SCRATCH}; /* t would do: N is what the arena knows */
    return N_ACTS;
}

/* The positions in their sequence of the t rows this rank holds of each
 * sequence (context parallelism: its chunks), the same in every one. */
static const int32_t *positions(const dt_gpt *m, const dt_block_call *c)
{
    int32_t *pos = (int32_t *)c->a[POS];
    const dt_seq_rows whole = dt_seq_span(0, c->t), *rows = m->cp.size > 1 ? &m->cp.rows : &whole;
    for (int ch = 0, i = 0; ch < rows->count; ch++)
        for (int p = rows->begin[ch]; p < rows->begin[ch] + rows->len[ch]; p++) pos[i++] = p;
    return pos;
}

/* Key/value head g's D columns of kv (rows ld apart) into the columns of
 * each query head of its group in packed [N, 3A] at column `at`
 * (forward), or the group's sum back, its heads in order (backward). */
static void repeat_kv(const dt_gpt *m, float *packed, float *kv, int ld, int at, int N, int back)
{
    const int D = head_dim(&m->cfg), A = m->tp.attn;
    const int group = m->tp.heads / m->tp.kv_heads;
    for (int i = 0; i < N; i++) {
        float *row = packed + (size_t)i * 3 * A + at, *one = kv + (size_t)i * ld;
        for (int g = 0; g < m->tp.kv_heads; g++) {
            float *src = one + (size_t)g * D, *head = row + (size_t)g * group * D;
            if (!back) {
                for (int h = 0; h < group; h++) memcpy(head + (size_t)h * D, src, D * sizeof *src);
                continue;
            }
            memcpy(src, head, D * sizeof *src);
            for (int h = 1; h < group; h++)
#pragma omp simd
                for (int d = 0; d < D; d++) src[d] += head[(size_t)h * D + d];
        }
    }
}

/* q's A columns between packed [N, 3A] and proj [N, W]. */
static void move_q(float *packed, float *proj, int A, int W, int N, int back)
{
    for (int i = 0; i < N; i++) {
        float *p = packed + (size_t)i * 3 * A, *q = proj + (size_t)i * W;
        memcpy(back ? q : p, back ? p : q, (size_t)A * sizeof(float));
    }
}

/* q's and k's heads in proj turned by their rows' positions (sign -1:
 * back, for their gradients). */
static void turn(dt_gpt *m, const dt_block_call *c, float *proj, int sign)
{
    const int A = m->tp.attn, W = proj_width(m), D = head_dim(&m->cfg);
    const double theta = dt_gpt_rope_theta(&m->cfg);
    const int32_t *pos = positions(m, c);
    dt_rope(proj, W, pos, c->b, c->t, m->tp.heads, D, theta, sign);
    dt_rope(proj + A, W, pos, c->b, c->t, m->tp.kv_heads, D, theta, sign);
}

static dt_linear_group qkv_group(const dt_gpt *m, const dt_block_call *c)
{
    const int out[3] = {m->tp.attn, kv_width(m), kv_width(m)};
    return dt_model_group(c, Q_W, 3, out);
}

/* q, k and v into proj; turned; into qkv, k and v repeated. */
static int project(dt_gpt *m, const dt_block_call *c)
{
    const int A = m->tp.attn, Ak = kv_width(m), W = proj_width(m), N = c->N;
    const dt_linear_group g = qkv_group(m, c);
    float *qkv = c->a[QKV], *proj = c->a[PROJ];
    if (dt_model_group_forward(m, c, &g, proj, "self_attn.q_proj/k_proj/v_proj")) return -1;
    turn(m, c, proj, 1);
    move_q(qkv, proj, A, W, N, 0);
    repeat_kv(m, qkv, proj + A, W, A, N, 0);
    repeat_kv(m, qkv, proj + A + Ak, W, 2 * A, N, 0);
    return 0;
}

static int forward(dt_gpt *m, const dt_block_call *c, unsigned run)
{
    if ((run & DT_RUN_PRODUCTS) &&
        (project(m, c) || dt_model_attend(m, c, c->a[ATT], c->a[LSE], c->a[QKV])))
        return -1;
    if (!(run & DT_RUN_OUTPUT)) return 0;
    return dt_model_branch_out(m, c, c->a[ATT], c->w[O_W], NULL, m->tp.attn, "self_attn.o_proj");
}

/* From the packed gradient to q's, k's and v's before the turn, in proj:
 * the groups' sums, turned back. */
static void unpack_grads(dt_gpt *m, const dt_block_call *c)
{
    const int A = m->tp.attn, Ak = kv_width(m), W = proj_width(m), N = c->N;
    float *dqkv = c->a[DQKV], *dproj = c->a[PROJ];
    move_q(dqkv, dproj, A, W, N, 1);
    repeat_kv(m, dqkv, dproj + A, W, A, N, 1);
    repeat_kv(m, dqkv, dproj + A + Ak, W, 2 * A, N, 1);
    turn(m, c, dproj, -1);
}

static int backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what)
{
    const int A = m->tp.attn;
    const dt_linear_group g = qkv_group(m, c);
    if (dt_model_branch_out_backward(m, c, what, m->acts.d_c, c->g[O_W], NULL, c->a[D_PROJ],
                                     c->a[ATT], c->w[O_W], A, "self_attn.o_proj backward"))
        return -1;
    if (dt_model_attend_backward(m, c, c->a[DQKV], c->a[QKV], c->a[ATT], c->a[LSE])) return -1;
    unpack_grads(m, c);
    return dt_model_group_backward(m, c, what, &g, c->a[PROJ], c->a[D_QKV],
                                   "self_attn.q_proj/k_proj/v_proj backward");
}

static int weights(dt_gpt *m, const dt_block_call *c)
{
    const int C = m->cfg.n_embd, A = m->tp.attn, N = c->N;
    const dt_linear_group g = qkv_group(m, c);
    if (dt_model_product_weights(m, c, c->g[O_W], NULL, c->a[D_PROJ], c->a[ATT], N, A, C,
                                 "self_attn.o_proj"))
        return -1;
    return dt_model_group_weights(m, c, &g, c->a[D_QKV], "self_attn.q_proj/k_proj/v_proj");
}

/* 6 per weight of its products (2 C^2 + 2 C KV D), and the attention's
 * 6 T C (attention.c). */
static double flops(const dt_gpt_config *cfg, int T)
{
    const double C = cfg->n_embd, KD = (double)dt_gpt_kv_heads(cfg) * head_dim(cfg);
    return 6.0 * (2.0 * C * C + 2.0 * C * KD) + 6.0 * (double)T * C;
}

const dt_block_kind dt_block_rope_attention = {
    .name = "rope_attention",
    .role = DT_BLOCK_BRANCH,
    .tensors = tensors,
    .acts = acts,
    .forward = forward,
    .backward = backward,
    .weights = weights,
    .flops = flops,
    .wlayout = DT_LINEAR,
};
