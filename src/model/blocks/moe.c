/* A mixture of experts as a block kind (a branch): a router and E experts
 * of GPT-2's MLP shape (c_fc C -> F, GELU, c_proj F -> C), each row
 * computed by the K experts its router chooses and their outputs summed
 * with the router's renormalized weights (kernels/router.h):
 *
 *     out[i] = sum_k w[i,k] expert_{c[i,k]}(x[i]),   res' = res + out
 *
 * The rows are sorted by expert, each expert's a contiguous run, so its
 * two products are one call each over its rows (grouped, no padding; an
 * expert with no rows costs nothing).
 *
 * Under expert parallelism (split.h, dt_gpt_ep: P ranks, El = E / P
 * experts each) the sorted rows are already grouped by the rank that
 * holds their experts: the counts go to those ranks, then the rows
 * (dispatch); each rank runs its experts on the rows it received, from
 * each source rank apart (a chunk: the rows one process would have run
 * for that rank's micro-batch, so the products see the same operands),
 * and the outputs go back (combine). Backward sends the outputs'
 * gradients the same way and brings the inputs' back.
 *
 * Under tensor parallelism (split.h, dt_gpt_tp) each expert is cut as the
 * dense MLP is (Megatron's): c_fc's columns and c_proj's rows [r F / tp,
 * (r + 1) F / tp) on rank r, the router and c_proj's bias whole. Every
 * rank routes the same rows the same way (the router's input is the
 * whole norm output), runs its slice of each expert, and the slots'
 * partial outputs are summed over the group before the bias (so the
 * combine's weights multiply whole outputs); backward sums the inputs'
 * gradients over the group (reduce-scattered to this rank's rows with
 * sequence parallelism) and adds the router's part to those rows once.
 *
 * Two kinds share this file, differing in their experts' form (`form`):
 *   moe         GPT-2's MLP: router.weight [E, C] (Linear layout: logits
 *               = x Wr^T), then per expert experts.{e}.c_fc.weight [C, F],
 *               .c_fc.bias [F], .c_proj.weight [F, C], .c_proj.bias [C]
 *               (GPT-2's Conv1D layout), GELU between
 *   moe_swiglu  Mixtral's (the Llama family's SwiGLU): gate.weight [E, C],
 *               then per expert experts.{e}.w1.weight [F, C] (gate),
 *               .w3.weight [F, C] (up), .w2.weight [C, F] (down), torch's
 *               Linear layout, no biases: w2(silu(w1 x) * w3 x)
 * Under expert parallelism the other ranks' experts are absent.
 * Buffers, N rows, S = N K routing slots, R the rows the experts here
 * can receive (S in one process; N P min(K, El) under P ranks):
 *   res [N, C]      the residual sum after it                  PRODUCT
 *   logits [N, E]   the router's product                        PRODUCT
 *   probs [N E + N] softmax and log-sum-exp                     ELEMENTWISE
 *   route           choice, weight, keep, pos, order [N K], count [E]
 *                                                               ELEMENTWISE
 *   cnt [E + 2P]    the rows received per (rank, expert), the rows sent
 *                   to and received from each rank              PRODUCT
 *   xs [S, C]       the rows gathered in expert order           ELEMENTWISE
 *   xr [R, C]       the rows received (P > 1; else xs)          PRODUCT
 *   h [R, F]        c_fc's (w1's) product, without its bias     PRODUCT
 *   g [R, F]        GELU's (silu(h) * u)                        ELEMENTWISE
 *   u [R, F]        w3's output (SwiGLU; else none)             PRODUCT
 *   y [S, C]        c_proj's, back in this rank's slot order    PRODUCT
 *   d_y, d_h, d_lg  SPLIT: the products' output gradients for the weight half
 *   dyx [R, C], dg [R, F], dw [S], dlg [N, E], dyl [S, C] (P > 1),
 *   wt [F C + F]    a chunk's weight gradient before it is added SCRATCH
 *   d_u [R, F], du [R, F]  w3's output gradient (SwiGLU)   SPLIT, SCRATCH */
#include <string.h>

#include "core/str.h"
#include "core/trace.h"
#include "kernels/gelu.h"
#include "kernels/router.h"
#include "kernels/swiglu.h"
#include "model/model_internal.h"

enum {
    RES, LOGITS, PROBS, ROUTE, CNT, XS, XR, H, G, Y, D_Y, D_H, D_LG,
    DYX, DG, DW, DLG, DYL, WT, U, D_U, DU, N_ACTS
};
/* Expert e's tensor j at 1 + per e + (j - 1): GPT-2's c_fc weight and
 * bias, c_proj weight and bias (per 4); SwiGLU's w1, w3 (UP_W), w2 (per 3). */
enum { ROUTER, FC_W, FC_B, UP_W = FC_B, PROJ_W, PROJ_B };

typedef struct {
    int swiglu;            /* else GPT-2's GELU MLP with biases */
    int per;               /* tensors an expert has */
    dt_wlayout lay;        /* its products' weights */
    const char *router;    /* the router's name */
    const char *names[4];  /* an expert's tensors, with its index for %d */
} expert_form;

static const expert_form gelu_form = {
    0, 4, DT_CONV1D, "router.weight",
    {"experts.%d.c_fc.weight", "experts.%d.c_fc.bias", "experts.%d.c_proj.weight",
     "experts.%d.c_proj.bias"}};
static const expert_form swiglu_form = {
    1, 3, DT_LINEAR, "gate.weight",
    {"experts.%d.w1.weight", "experts.%d.w3.weight", "experts.%d.w2.weight", NULL}};

extern const dt_block_kind dt_block_moe_swiglu;

static const expert_form *form(const dt_block_call *c)
{
    return c->blk->kind == &dt_block_moe_swiglu ? &swiglu_form : &gelu_form;
}

#define W_(c, e, j) ((c)->w[1 + form(c)->per * (e) + ((j) - 1)])
#define G_(c, e, j) ((c)->g[1 + form(c)->per * (e) + ((j) - 1)])

static int ffn(const dt_gpt_config *cfg)
{
    return cfg->moe.ffn > 0 ? cfg->moe.ffn : dt_gpt_ffn(cfg);
}

/* An expert's hidden width on this rank (its slice under tensor parallelism). */
static int ffn_here(const dt_gpt *m)
{
    return ffn(&m->cfg) / m->tp.size;
}

/* GPT-2's expert: c_fc [C, F] and its bias, c_proj [F, C] and its bias;
 * under tp this rank's columns of c_fc, the same rows of c_proj. */
static void gelu_expert(dt_tensor_spec *t, int C, int F, int r, int Fl, int split)
{
    t[0] = (dt_tensor_spec){"", C, F, {0}, DT_INIT_NORMAL, 0, 0};
    t[1] = (dt_tensor_spec){"", F, 0, {0}, DT_INIT_ZERO, 0, 0};
    t[2] = (dt_tensor_spec){"", F, C, {0}, DT_INIT_RESIDUAL, 0, 0};
    t[3] = (dt_tensor_spec){"", C, 0, {0}, DT_INIT_ZERO, 0, 0};
    if (!split) return;
    t[0].slice = (dt_slice){0, C, 1, r * Fl, 0, Fl};
    t[1].slice = (dt_slice){0, 1, 1, r * Fl, 0, Fl};
    t[2].slice = (dt_slice){r * Fl, Fl, 1, 0, 0, C};
}

/* SwiGLU's: w1, w3 [F, C], w2 [C, F]; under tp this rank's rows of w1
 * and w3, the same columns of w2. */
static void swiglu_expert(dt_tensor_spec *t, int C, int F, int r, int Fl, int split)
{
    t[0] = (dt_tensor_spec){"", F, C, {0}, DT_INIT_NORMAL, 0, 0};
    t[1] = (dt_tensor_spec){"", F, C, {0}, DT_INIT_NORMAL, 0, 0};
    t[2] = (dt_tensor_spec){"", C, F, {0}, DT_INIT_RESIDUAL, 0, 0};
    if (!split) return;
    t[0].slice = t[1].slice = (dt_slice){r * Fl, Fl, 1, 0, 0, C};
    t[2].slice = (dt_slice){0, C, 1, r * Fl, 0, Fl};
}

static int tensors_of(const expert_form *f, const dt_gpt_config *cfg, const dt_gpt_tp *tp,
                      const dt_gpt_ep *ep, dt_tensor_spec *out)
{
    const int C = cfg->n_embd, E = cfg->moe.experts, F = ffn(cfg);
    const int split = tp && tp->size > 1, r = split ? tp->rank : 0;
    const int Fl = split ? F / tp->size : F;
    const int e0 = ep ? ep->e0 : 0, e1 = ep ? ep->e0 + ep->experts : E;
    const int apart = ep && ep->size > 1;
    out[0] = (dt_tensor_spec){"", E, C, {0}, DT_INIT_NORMAL, 0, 0};
    dt_strf(out[0].name, sizeof out[0].name, "%s", f->router);
    for (int e = 0; e < E; e++) {
        dt_tensor_spec *t = out + 1 + f->per * e;
        const int absent = e < e0 || e >= e1;
        (f->swiglu ? swiglu_expert : gelu_expert)(t, C, F, r, Fl, split && !absent);
        for (int j = 0; j < f->per; j++) {
            t[j].absent = absent, t[j].apart = apart;
            dt_strf(t[j].name, sizeof t[j].name, f->names[j], e);
        }
    }
    return 1 + f->per * E;
}

static int tensors(const dt_gpt_config *cfg, const dt_gpt_tp *tp, const dt_gpt_ep *ep,
                   dt_tensor_spec *out)
{
    return tensors_of(&gelu_form, cfg, tp, ep, out);
}

static int tensors_swiglu(const dt_gpt_config *cfg, const dt_gpt_tp *tp, const dt_gpt_ep *ep,
                          dt_tensor_spec *out)
{
    return tensors_of(&swiglu_form, cfg, tp, ep, out);
}

/* The rows the experts here can receive: every rank's N rows, each
 * bringing at most min(K, El) of its slots. */
static size_t received_max(const dt_gpt *m, size_t N)
{
    const size_t K = (size_t)m->cfg.moe.topk, P = (size_t)m->ep.size;
    const size_t El = (size_t)m->ep.experts;
    return P > 1 ? N * P * (K < El ? K : El) : N * K;
}

static int acts_of(int swiglu, const dt_gpt *m, size_t N, size_t R, dt_act_spec *out)
{
    const size_t C = (size_t)m->cfg.n_embd, E = (size_t)m->cfg.moe.experts;
    const size_t K = (size_t)m->cfg.moe.topk, F = (size_t)ffn_here(m), S = N * K;
    const size_t P = (size_t)m->ep.size, X = received_max(m, N);
    out[RES] = (dt_act_spec){R * C, DT_ACT_PRODUCT};
    out[LOGITS] = (dt_act_spec){N * E, DT_ACT_PRODUCT};
    out[PROBS] = (dt_act_spec){N * E + N, DT_ACT_ELEMENTWISE};
    const size_t cp = (size_t)m->cp.size; /* whole sequences' choices and drops under cp */
    out[ROUTE] = (dt_act_spec){5 * S + E + N * E + (cp > 1 ? 3 * cp * S : 0),
                               DT_ACT_ELEMENTWISE};
    out[CNT] = (dt_act_spec){E + 2 * P, DT_ACT_PRODUCT};
    out[XS] = (dt_act_spec){S * C, DT_ACT_ELEMENTWISE};
    out[XR] = (dt_act_spec){P > 1 ? X * C : 0, DT_ACT_PRODUCT};
    out[H] = (dt_act_spec){X * F, DT_ACT_PRODUCT};
    out[G] = (dt_act_spec){X * F, DT_ACT_ELEMENTWISE};
    out[Y] = (dt_act_spec){S * C, DT_ACT_PRODUCT};
    out[D_Y] = (dt_act_spec){X * C, DT_ACT_SPLIT};
    out[D_H] = (dt_act_spec){X * F, DT_ACT_SPLIT};
    out[D_LG] = (dt_act_spec){N * E, DT_ACT_SPLIT};
    out[DYX] = (dt_act_spec){X * C, DT_ACT_SCRATCH};
    out[DG] = (dt_act_spec){X * F, DT_ACT_SCRATCH};
    out[DW] = (dt_act_spec){S, DT_ACT_SCRATCH};
    out[DLG] = (dt_act_spec){N * E, DT_ACT_SCRATCH};
    out[DYL] = (dt_act_spec){P > 1 ? S * C : 0, DT_ACT_SCRATCH};
    out[WT] = (dt_act_spec){P > 1 ? F * C + (F > C ? F : C) : 0, DT_ACT_SCRATCH};
    out[U] = (dt_act_spec){swiglu ? X * F : 0, DT_ACT_PRODUCT};
    out[D_U] = (dt_act_spec){swiglu ? X * F : 0, DT_ACT_SPLIT};
    out[DU] = (dt_act_spec){swiglu ? X * F : 0, DT_ACT_SCRATCH};
    return N_ACTS;
}

static int acts(const dt_gpt *m, size_t N, size_t R, dt_act_spec *out)
{
    return acts_of(0, m, N, R, out);
}

static int acts_swiglu(const dt_gpt *m, size_t N, size_t R, dt_act_spec *out)
{
    return acts_of(1, m, N, R, out);
}

/* The route buffer's arrays (ints stored in the float arena), and the
 * exchange's counts. */
typedef struct {
    int32_t *choice, *keep, *pos, *order, *count;
    float *weight;
    int32_t *seq_cnt;               /* [b][E]: each whole sequence's slots per expert */
    int32_t *ranks, *whole, *whole_keep; /* cp: [cp][S] the ranks' choices; [b][T][K] the
                                      * sequences' choices and drops in position order */
    int32_t *rc;                    /* [P][El]: rows from rank s for expert e0 + j */
    int32_t *send_rows, *recv_rows; /* [P] each */
} route;

static route route_of(const dt_gpt *m, const dt_block_call *c)
{
    const size_t S = (size_t)c->N * (size_t)m->cfg.moe.topk, E = (size_t)m->cfg.moe.experts;
    float *r = c->a[ROUTE];
    int32_t *n = (int32_t *)c->a[CNT], *w = (int32_t *)(r + 5 * S + E + (size_t)c->N * E);
    const size_t cpS = (size_t)m->cp.size * S;
    return (route){.choice = (int32_t *)r, .weight = r + S, .keep = (int32_t *)(r + 2 * S),
                   .pos = (int32_t *)(r + 3 * S), .order = (int32_t *)(r + 4 * S),
                   .count = (int32_t *)(r + 5 * S), .seq_cnt = (int32_t *)(r + 5 * S + E),
                   .ranks = w, .whole = w + cpS, .whole_keep = w + 2 * cpS, .rc = n,
                   .send_rows = n + E, .recv_rows = n + E + m->ep.size};
}

/* Context parallelism: rank q's rows of each sequence (their positions,
 * dt_seq_shard's) copied between rank-order rows, [b][tl][K], and
 * position order, [b][T][K]; to_whole picks the direction. */
static void place_rows(const dt_gpt *m, int q, int32_t *rows, int32_t *whole, int b, int tl,
                       int to_whole)
{
    const int K = m->cfg.moe.topk, T = tl * m->cp.size;
    dt_seq_rows sh;
    dt_seq_shard(&sh, T, q, m->cp.size, m->cp.kind);
    for (int s = 0; s < b; s++)
        for (int ch = 0, off = 0; ch < sh.count; off += sh.len[ch++]) {
            int32_t *a = rows + ((size_t)s * tl + off) * K;
            int32_t *w = whole + ((size_t)s * T + sh.begin[ch]) * K;
            const size_t bytes = (size_t)sh.len[ch] * K * sizeof(int32_t);
            memcpy(to_whole ? w : a, to_whole ? a : w, bytes);
        }
}

/* The drops and the sequences' counts. They are per whole sequence: under
 * context parallelism the group's choices are gathered into position
 * order first, so every rank drops the same slots one process would. */
static long drop_and_count(dt_gpt *m, const dt_block_call *c, route *r, int cap)
{
    const int K = m->cfg.moe.topk, E = m->cfg.moe.experts, cp = m->cp.size;
    if (cp == 1) {
        dt_router_seq_counts(r->seq_cnt, r->choice, c->b, c->t, K, E);
        return dt_router_capacity(r->keep, r->choice, c->b, c->t, K, E, cap);
    }
    const size_t S = (size_t)c->N * K;
    char why[200];
    if (!m->cp.gather ||
        m->cp.gather(m->cp.ctx, r->choice, r->ranks, S * sizeof(int32_t), why, sizeof why))
        return dt_strf(m->error, sizeof m->error, "model: moe routing over the context-"
                       "parallel group: %s", m->cp.gather ? why : "no group"), -1;
    for (int q = 0; q < cp; q++)
        place_rows(m, q, r->ranks + (size_t)q * S, r->whole, c->b, c->t, 1);
    dt_router_seq_counts(r->seq_cnt, r->whole, c->b, c->t * cp, K, E);
    dt_router_capacity(r->whole_keep, r->whole, c->b, c->t * cp, K, E, cap);
    place_rows(m, m->cp.rank, r->keep, r->whole_keep, c->b, c->t, 0);
    long dropped = 0; /* this rank's rows' */
    for (size_t i = 0; i < S; i++) dropped += !r->keep[i];
    return dropped;
}

/* Softmax, the top K, the drops, the sort, and the rows gathered in
 * expert order; a forward's first run of the layer counts its stats. */
static int route_rows(dt_gpt *m, const dt_block_call *c, int count_stats)
{
    const dt_moe_config *mc = &m->cfg.moe;
    const int N = c->N, E = mc->experts, K = mc->topk, C = m->cfg.n_embd;
    const int T = c->t * m->cp.size; /* whole sequences (context parallelism's rows: c->t) */
    float *probs = c->a[PROBS], *lse = probs + (size_t)N * E;
    const float *bias = m->moe.bias ? m->moe.bias + (size_t)c->layer * E : NULL;
    route r = route_of(m, c);
    dt_router_softmax(probs, lse, c->a[LOGITS], N, E);
    dt_router_topk(r.choice, r.weight, probs, bias, N, E, K);
    const long dropped = drop_and_count(m, c, &r, mc->capacity > 0 ? dt_moe_capacity(mc, T) : 0);
    if (dropped < 0) return -1;
    const int S = dt_router_sort(r.order, r.count, r.pos, r.choice, r.keep, N, E, K);
    for (int s = 0; s < S; s++)
        memcpy(c->a[XS] + (size_t)s * C, c->x + (size_t)(r.order[s] / K) * C,
               (size_t)C * sizeof(float));
    if (!count_stats || !m->moe.stats) return 0;
    dt_moe_layer_stats *st = &m->moe.stats[c->layer];
    dt_router_stats(probs, lse, r.choice, r.keep, r.seq_cnt, c->b, c->t, T, E, K, &st->aux_sum,
                    &st->z_sum, st->load);
    if (m->cp.rank == 0) st->seqs += c->b; /* the group's ranks share the sequences */
    st->tokens += N;
    st->dropped += (double)dropped;
    return 0;
}

/* ---- the exchange (expert parallelism) ---------------------------------- */

static int ep_failed(dt_gpt *m, const char *what, const char *why)
{
    return dt_strf(m->error, sizeof m->error, "model: moe %s: %s", what, why), -1;
}

/* Each rank's counts of its experts' rows from here, and ours from each
 * rank: the rows sent to and received from each. */
static int exchange_counts(dt_gpt *m, const dt_block_call *c)
{
    const int P = m->ep.size, El = m->ep.experts;
    route r = route_of(m, c);
    char why[200];
    if (!m->ep.counts || m->ep.counts(m->ep.ctx, r.count, r.rc, El, why, sizeof why))
        return ep_failed(m, "dispatch counts", m->ep.counts ? why : "no expert-parallel group");
    for (int q = 0; q < P; q++) {
        r.send_rows[q] = r.recv_rows[q] = 0;
        for (int j = 0; j < El; j++) {
            r.send_rows[q] += r.count[q * El + j];
            r.recv_rows[q] += r.rc[q * El + j];
        }
    }
    return 0;
}

/* Rows of width floats: out (dispatch, this rank's slots to the experts'
 * ranks) or back (combine: what they computed, home); start: in flight
 * until exchange_wait. */
static int exchange_rows(dt_gpt *m, const dt_block_call *c, const float *send, float *recv,
                         int width, int back, int start, const char *what)
{
    route r = route_of(m, c);
    char why[200];
    if (m->ep.rows(m->ep.ctx, send, back ? r.recv_rows : r.send_rows, recv,
                   back ? r.send_rows : r.recv_rows, width,
                   back ? "moe combine" : "moe dispatch", start, why, sizeof why))
        return ep_failed(m, what, why);
    return 0;
}

static int exchange_wait(dt_gpt *m, const char *what)
{
    char why[200];
    return m->ep.rows_wait(m->ep.ctx, why, sizeof why) ? ep_failed(m, what, why) : 0;
}

/* ---- the experts' products --------------------------------------------- */

/* The chunks of rows the experts here run: expert e0 + j's rows from rank
 * s (one process: s = 0, all its rows), at row `first` of xr, in the
 * order (j, s). */
typedef struct {
    int j, s, rows;
    size_t first;
} chunk;

static int next_chunk(const dt_gpt *m, const dt_block_call *c, int k, chunk *out)
{
    const int P = m->ep.size, El = m->ep.experts;
    route r = route_of(m, c);
    if (k >= El * P) return 0;
    out->j = k / P, out->s = k % P;
    size_t first = 0;
    if (P == 1) {
        for (int e = 0; e < out->j; e++) first += (size_t)r.count[e];
        out->rows = r.count[out->j];
    } else { /* xr holds rank 0's rows of each expert, then rank 1's, ... */
        for (int s = 0; s < out->s; s++) first += (size_t)r.recv_rows[s];
        for (int j = 0; j < out->j; j++) first += (size_t)r.rc[out->s * El + j];
        out->rows = r.rc[out->s * El + out->j];
    }
    out->first = first;
    return 1;
}

/* Which chunks a pass runs: the rows this rank routed to its own experts
 * need no exchange, so they run while the other ranks' rows travel. */
enum { OWN = 1, OTHERS = 2 };

static int in_part(const dt_gpt *m, const chunk *k, int part)
{
    return part & (m->ep.size == 1 || k->s == m->ep.rank ? OWN : OTHERS);
}

/* Where a chunk's rows of width w sit: in `rows` (the received layout),
 * or for an own chunk in `own` when given (this rank's slots sorted by
 * expert: what the exchange in flight is still copying into rows). */
static const float *chunk_in(const dt_gpt *m, const dt_block_call *c, const chunk *k,
                             const float *rows, const float *own, int w)
{
    if (!own || m->ep.size == 1 || k->s != m->ep.rank) return rows + k->first * w;
    route r = route_of(m, c);
    size_t first = 0;
    for (int e = 0; e < m->ep.e0 + k->j; e++) first += (size_t)r.count[e];
    return own + first * w;
}

/* A part's chunks forward: h = x W_fc, g = gelu(h + b), y = g W_proj (+ b,
 * but under tensor parallelism: experts_output_sum); SwiGLU: h = x W1^T,
 * u = x W3^T, g = silu(h) u, y = g W2^T. xs: own rows. */
static int experts_forward(dt_gpt *m, const dt_block_call *c, unsigned run, int part,
                           const float *xr, const float *xs, float *yr)
{
    const expert_form *f = form(c);
    const int C = m->cfg.n_embd, F = ffn_here(m), bias = !f->swiglu && m->tp.size == 1;
    chunk k;
    for (int i = 0; next_chunk(m, c, i, &k); i++) {
        if (!k.rows || !in_part(m, &k, part)) continue;
        const int e = m->ep.e0 + k.j;
        const size_t at = k.first * F;
        float *h = c->a[H] + at, *g = c->a[G] + at, *u = c->a[U] + at;
        const float *x = chunk_in(m, c, &k, xr, xs, C);
        if ((run & DT_RUN_PRODUCTS) &&
            (dt_linear_forward_l(m->prec, f->lay, h, x, W_(c, e, FC_W), NULL, k.rows, C, F) ||
             (f->swiglu && dt_linear_forward_l(m->prec, f->lay, u, x, W_(c, e, UP_W), NULL,
                                               k.rows, C, F))))
            return dt_model_fail_matmul(m, "moe experts' c_fc");
        if ((run & DT_RUN_ELEMENTWISE) && f->swiglu)
            dt_swiglu_forward(g, h, u, (size_t)k.rows * F);
        else if (run & DT_RUN_ELEMENTWISE)
            dt_gelu_bias_forward(g, h, W_(c, e, FC_B), (size_t)k.rows, (size_t)F);
        if ((run & DT_RUN_PRODUCTS) &&
            dt_linear_forward_l(m->prec, f->lay, yr + k.first * C, g, W_(c, e, PROJ_W),
                                bias ? W_(c, e, PROJ_B) : NULL, k.rows, F, C))
            return dt_model_fail_matmul(m, "moe experts' c_proj");
    }
    return 0;
}

/* Tensor parallelism: the slots' partial outputs (rows of y) summed over
 * the group, then each expert's bias, once (GPT-2's experts have one). */
static int experts_output_sum(dt_gpt *m, const dt_block_call *c, float *y, size_t rows)
{
    const int C = m->cfg.n_embd;
    if (dt_model_tp_reduce(m, y, rows * (size_t)C, DT_TP_SUM_F32, "moe experts' c_proj"))
        return -1;
    chunk k;
    for (int i = 0; !form(c)->swiglu && next_chunk(m, c, i, &k); i++) {
        const float *b = W_(c, m->ep.e0 + k.j, PROJ_B);
        for (size_t r = k.first; r < k.first + (size_t)k.rows; r++)
            for (int j = 0; j < C; j++) y[r * C + j] += b[j];
    }
    return 0;
}

/* A chunk's weight gradient (db NULL: no bias). The first rank's rows add
 * into the gradient; another rank's are formed apart and added once, as
 * one process adds a later micro-batch's (gpt.h: dt_gpt_accum), so the
 * sum is the same. */
static int chunk_weights(dt_gpt *m, const dt_block_call *c, const chunk *k, float *dW,
                         float *db, const float *dout, const float *inp, int IN, int OUT,
                         const char *name)
{
    if (k->s == 0) return dt_model_product_weights(m, c, dW, db, dout, inp, k->rows, IN, OUT, name);
    float *tw = c->a[WT], *tb = db ? tw + (size_t)IN * OUT : NULL;
    memset(tw, 0, ((size_t)IN * OUT + (db ? (size_t)OUT : 0)) * sizeof(float));
    if (dt_model_product_weights(m, c, tw, tb, dout, inp, k->rows, IN, OUT, name)) return -1;
    dt_model_add_into(dW, dW, tw, (size_t)IN * OUT);
    if (db) dt_model_add_into(db, db, tb, (size_t)OUT);
    return 0;
}

/* Tensor j's gradient (and its bias's, j + 1, GPT-2's) from every chunk,
 * in chunk order: each expert's ranks in rank order. */
static int experts_weights(dt_gpt *m, const dt_block_call *c, int j, const float *dout,
                           const float *inp, int IN, int OUT, const char *name)
{
    chunk k;
    for (int i = 0; next_chunk(m, c, i, &k); i++) {
        const int e = m->ep.e0 + k.j;
        if (k.rows && chunk_weights(m, c, &k, G_(c, e, j),
                                    form(c)->swiglu ? NULL : G_(c, e, j + 1),
                                    dout + k.first * OUT, inp + k.first * IN, IN, OUT, name))
            return -1;
    }
    return 0;
}

/* Every expert tensor's gradient: the output product's (from dy and g),
 * then the input products' (from dh, and SwiGLU's du, and the rows xr). */
static int experts_all_weights(dt_gpt *m, const dt_block_call *c, const float *dy,
                               const float *dh, const float *du, const float *xr)
{
    const int C = m->cfg.n_embd, F = ffn_here(m);
    return experts_weights(m, c, PROJ_W, dy, c->a[G], F, C, "moe experts' c_proj") ||
                   experts_weights(m, c, FC_W, dh, xr, C, F, "moe experts' c_fc") ||
                   (form(c)->swiglu && experts_weights(m, c, UP_W, du, xr, C, F,
                                                       "moe experts' w3"))
               ? -1
               : 0;
}

/* A part's chunks backward to the hidden layer: dg = dy W_proj^T, then
 * dh = gelu'(h) dg (in place when dh is dg), or SwiGLU's dh (w1's output
 * gradient) and du (w3's). dyo: own rows. */
static int experts_hidden_grads(dt_gpt *m, const dt_block_call *c, int part, const float *dy,
                                const float *dyo, float *dg, float *dh, float *du)
{
    const expert_form *f = form(c);
    const int C = m->cfg.n_embd, F = ffn_here(m);
    chunk k;
    for (int i = 0; next_chunk(m, c, i, &k); i++) {
        if (!k.rows || !in_part(m, &k, part)) continue;
        const size_t a = k.first * F, n = (size_t)k.rows * F;
        if (dt_linear_backward_l(m->prec, f->lay, dg + a, 0, NULL, NULL,
                                 chunk_in(m, c, &k, dy, dyo, C), NULL,
                                 W_(c, m->ep.e0 + k.j, PROJ_W), k.rows, F, C))
            return dt_model_fail_matmul(m, "moe experts' c_proj backward");
        if (f->swiglu) dt_swiglu_backward(dh + a, du + a, dg + a, c->a[H] + a, c->a[U] + a, n);
        else
            dt_gelu_bias_backward(dh + a, c->a[H] + a, W_(c, m->ep.e0 + k.j, FC_B), dg + a,
                                  (size_t)k.rows, (size_t)F);
    }
    return 0;
}

/* Every chunk's input gradient: dx = dh W_fc^T (SwiGLU: dh W1 + du W3). */
static int experts_input_grads(dt_gpt *m, const dt_block_call *c, const float *dh,
                               const float *du, float *dx)
{
    const expert_form *f = form(c);
    const int C = m->cfg.n_embd, F = ffn_here(m);
    chunk k;
    for (int i = 0; next_chunk(m, c, i, &k); i++) {
        const int e = m->ep.e0 + k.j;
        const size_t a = k.first * F;
        if (k.rows &&
            (dt_linear_backward_l(m->prec, f->lay, dx + k.first * C, 0, NULL, NULL, dh + a,
                                  NULL, W_(c, e, FC_W), k.rows, C, F) ||
             (f->swiglu && dt_linear_backward_l(m->prec, f->lay, dx + k.first * C, 1, NULL,
                                                NULL, du + a, NULL, W_(c, e, UP_W), k.rows, C,
                                                F))))
            return dt_model_fail_matmul(m, "moe experts' c_fc backward");
    }
    return 0;
}

/* The rows the experts here run: what this rank received (expert
 * parallelism), or its own kept slots. */
static size_t expert_rows(const dt_gpt *m, const dt_block_call *c)
{
    route r = route_of(m, c);
    size_t rows = 0;
    for (int q = 0; m->ep.size > 1 && q < m->ep.size; q++) rows += (size_t)r.recv_rows[q];
    for (int e = 0; m->ep.size == 1 && e < m->cfg.moe.experts; e++) rows += (size_t)r.count[e];
    return rows;
}

/* ---- forward ------------------------------------------------------------ */

/* res' = res + sum_k w[i,k] y[pos[i,k]] over the kept slots, k in order,
 * for this rank's rows of the residual stream (all of them but under
 * sequence parallelism). */
static void combine(dt_gpt *m, const dt_block_call *c)
{
    const int C = m->cfg.n_embd, K = m->cfg.moe.topk;
    const size_t R = dt_model_region_rows(m, (size_t)c->N), r0 = dt_model_region_first(m, c->N);
    route r = route_of(m, c);
    for (size_t i = r0; i < r0 + R; i++) {
        float *o = c->a[RES] + (i - r0) * C;
        const float *res = c->res + (i - r0) * C;
        for (int j = 0; j < C; j++) o[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            const int32_t p = r.pos[i * K + k];
            if (p < 0) continue;
            const float w = r.weight[i * K + k], *y = c->a[Y] + (size_t)p * C;
            for (int j = 0; j < C; j++) o[j] += w * y[j];
        }
        for (int j = 0; j < C; j++) o[j] += res[j];
    }
}

/* The experts' own compute on the timeline (--trace), between the
 * exchanges that the expert-parallel layer records. */
static void trace_experts(const char *name, uint64_t t0)
{
    if (!dt_trace_on()) return;
    dt_trace_args ta = dt_trace_noargs();
    dt_trace_add(DT_TRACE_COMPUTE, name, t0, dt_trace_now(), &ta);
}

/* Dispatch, the experts, and (expert parallelism) the outputs home. The
 * rows this rank keeps run while the others' travel. */
static int experts_run(dt_gpt *m, const dt_block_call *c, unsigned run)
{
    const int C = m->cfg.n_embd, P = m->ep.size;
    const int move = (run & DT_RUN_PRODUCTS) && P > 1;
    const float *xr = P > 1 ? c->a[XR] : c->a[XS];
    float *yr = P > 1 ? c->a[DYX] : c->a[Y];
    if (move && (exchange_counts(m, c) ||
                 exchange_rows(m, c, c->a[XS], c->a[XR], C, 0, 1, "dispatch")))
        return -1;
    const uint64_t t0 = dt_trace_now();
    int bad = experts_forward(m, c, run, OWN, xr, c->a[XS], yr) != 0;
    if (move) bad |= exchange_wait(m, "dispatch") != 0;
    if (bad || experts_forward(m, c, run, OTHERS, xr, NULL, yr)) return -1;
    if (!(run & DT_RUN_PRODUCTS)) return 0;
    trace_experts("moe experts", t0);
    if (m->tp.size > 1 && experts_output_sum(m, c, yr, expert_rows(m, c))) return -1;
    return P > 1 ? exchange_rows(m, c, yr, c->a[Y], C, 1, 0, "combine") : 0;
}

/* --moe-router-force-load-balancing: each row's logits hashed from its
 * layer and its position in its sequence (context parallelism: the
 * positions dt_seq_shard gives this rank), so the positions spread evenly
 * over the experts, the same way under every layout. */
static void hash_route(dt_gpt *m, const dt_block_call *c)
{
    const int E = m->cfg.moe.experts;
    dt_seq_rows sh = dt_seq_span(0, c->t);
    if (m->cp.size > 1) dt_seq_shard(&sh, c->t * m->cp.size, m->cp.rank, m->cp.size, m->cp.kind);
    for (int s = 0; s < c->b; s++)
        for (int ch = 0, i = s * c->t; ch < sh.count; ch++)
            for (int p = sh.begin[ch]; p < sh.begin[ch] + sh.len[ch]; p++, i++)
                dt_router_hash_logits(c->a[LOGITS] + (size_t)i * E, E,
                                      ((uint64_t)c->layer << 32) + (uint64_t)p);
}

static int forward(dt_gpt *m, const dt_block_call *c, unsigned run)
{
    const int C = m->cfg.n_embd, E = m->cfg.moe.experts, N = c->N;
    if ((run & DT_RUN_PRODUCTS) && m->cfg.moe.force_balance)
        hash_route(m, c);
    else if ((run & DT_RUN_PRODUCTS) &&
        dt_matmul(m->prec, 0, 1, N, E, C, 1.0f, c->x, C, c->w[ROUTER], C, 0.0f, c->a[LOGITS],
                  E))
        return dt_model_fail_matmul(m, "mlp.router");
    /* Every rank of a tensor-parallel group routes the same rows: one counts them. */
    if ((run & DT_RUN_ELEMENTWISE) && route_rows(m, c, run == DT_RUN_ALL && m->tp.rank == 0))
        return -1;
    if (experts_run(m, c, run)) return -1;
    if (run & DT_RUN_OUTPUT) combine(m, c);
    return 0;
}

/* ---- backward ----------------------------------------------------------- */

/* dy[pos] = w d_out[i] for each kept slot, and dw = d_out[i] . y[pos]
 * (0 for a dropped slot). */
static void combine_backward(dt_gpt *m, const dt_block_call *c, const float *d, float *dy,
                             float *dw)
{
    const int C = m->cfg.n_embd, K = m->cfg.moe.topk;
    route r = route_of(m, c);
    for (int i = 0; i < c->N; i++)
        for (int k = 0; k < K; k++) {
            const int32_t p = r.pos[i * K + k];
            const float *di = d + (size_t)i * C;
            float s = 0.0f;
            if (p >= 0) {
                const float w = r.weight[i * K + k], *y = c->a[Y] + (size_t)p * C;
                float *o = dy + (size_t)p * C;
                for (int j = 0; j < C; j++) o[j] = w * di[j], s += di[j] * y[j];
            }
            dw[i * K + k] = s;
        }
}

/* d_c[i] = sum over its kept slots of dxs[pos], k in order. */
static void scatter_back(dt_gpt *m, const dt_block_call *c, const float *dxs)
{
    const int C = m->cfg.n_embd, K = m->cfg.moe.topk;
    route r = route_of(m, c);
    for (int i = 0; i < c->N; i++) {
        float *o = m->acts.d_c + (size_t)i * C;
        for (int j = 0; j < C; j++) o[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            const int32_t p = r.pos[i * K + k];
            if (p < 0) continue;
            for (int j = 0; j < C; j++) o[j] += dxs[(size_t)p * C + j];
        }
    }
}

/* From the gradient of the outputs (this rank's slots) to that of the
 * inputs (this rank's slots, in dxs): through the experts, wherever they
 * are. The own rows start while the others' gradients travel; the input
 * products' weights are formed while the inputs' gradients go home. */
static int experts_backward_all(dt_gpt *m, const dt_block_call *c, dt_bwd_part what,
                                const float *dyl, float **dxs)
{
    const int C = m->cfg.n_embd, F = ffn_here(m), P = m->ep.size;
    const int whole = what == DT_BWD_WHOLE;
    float *dy = whole ? c->a[DYX] : c->a[D_Y], *dh = whole ? c->a[DG] : c->a[D_H];
    float *du = whole ? c->a[DU] : c->a[D_U];
    const float *xr = P > 1 ? c->a[XR] : c->a[XS];
    const char *out = "dispatch of the outputs' gradients", *in = "combine of the inputs' "
                                                                  "gradients";
    if (P > 1 && exchange_rows(m, c, dyl, dy, C, 0, 1, out)) return -1;
    const uint64_t t0 = dt_trace_now();
    int bad = experts_hidden_grads(m, c, OWN, dy, dyl, c->a[DG], dh, du) != 0;
    if (P > 1) bad |= exchange_wait(m, out) != 0;
    if (bad || experts_hidden_grads(m, c, OTHERS, dy, NULL, c->a[DG], dh, du)) return -1;
    /* c_proj's weights before dx takes dy's place (whole: the same buffer). */
    if (whole && experts_weights(m, c, PROJ_W, dy, c->a[G], F, C, "moe experts' c_proj"))
        return -1;
    if (experts_input_grads(m, c, dh, du, c->a[DYX])) return -1;
    *dxs = P > 1 ? c->a[DYL] : c->a[DYX];
    if (P > 1 && exchange_rows(m, c, c->a[DYX], c->a[DYL], C, 1, 1, in)) return -1;
    bad = whole && (experts_weights(m, c, FC_W, dh, xr, C, F, "moe experts' c_fc") ||
                    (form(c)->swiglu &&
                     experts_weights(m, c, UP_W, du, xr, C, F, "moe experts' w3")));
    trace_experts("moe experts backward", t0);
    if (P > 1) bad |= exchange_wait(m, in) != 0;
    return bad ? -1 : 0;
}

static int backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what)
{
    const dt_moe_config *mc = &m->cfg.moe;
    const int C = m->cfg.n_embd, E = mc->experts, K = mc->topk, N = c->N;
    const int whole = what == DT_BWD_WHOLE, P = m->ep.size;
    float *dlg = whole ? c->a[DLG] : c->a[D_LG], *probs = c->a[PROBS], *dxs;
    route r = route_of(m, c);
    /* One process: the outputs' gradient straight into the experts' rows. */
    float *dyl = P > 1 ? c->a[DYL] : whole ? c->a[DYX] : c->a[D_Y];
    const float *d_out = dt_model_rows_gathered(m, m->acts.d_res, N, "moe combine backward");
    if (!d_out) return -1;
    combine_backward(m, c, d_out, dyl, c->a[DW]);
    if (experts_backward_all(m, c, what, dyl, &dxs)) return -1;
    scatter_back(m, c, dxs);
    if (m->tp.size > 1 && dt_model_input_grad_sum(m, N, "moe experts' c_fc backward"))
        return -1;
    const float gs = m->moe.grad_scale;
    const int T = c->t * m->cp.size;
    dt_router_backward(dlg, c->a[DW], probs, probs + (size_t)N * E, r.choice, r.weight,
                       r.seq_cnt, c->b, c->t, T, E, K, (float)(gs * T * mc->aux_coeff),
                       (float)(gs * mc->z_coeff));
    /* Forced balance: the logits do not come from the router, so neither
     * it nor the input learns from them (Megatron's rule). */
    if (mc->force_balance) memset(dlg, 0, (size_t)N * E * sizeof(float));
    /* The router's part of the input's gradient, once, on this rank's rows. */
    const size_t R = dt_model_region_rows(m, (size_t)N), r0 = dt_model_region_first(m, N);
    if (dt_matmul(m->prec, 0, 0, (int)R, C, E, 1.0f, dlg + r0 * E, E, c->w[ROUTER], C, 1.0f,
                  m->acts.d_c, C) ||
        (whole && dt_matmul(m->prec, 1, 0, E, C, N, 1.0f, dlg, E, c->x, C, 1.0f, c->g[ROUTER],
                            C)))
        return dt_model_fail_matmul(m, "moe router backward");
    return 0;
}

static int weights(dt_gpt *m, const dt_block_call *c)
{
    const int C = m->cfg.n_embd, E = m->cfg.moe.experts;
    const float *xr = m->ep.size > 1 ? c->a[XR] : c->a[XS];
    if (experts_all_weights(m, c, c->a[D_Y], c->a[D_H], c->a[D_U], xr)) return -1;
    if (dt_matmul(m->prec, 1, 0, E, C, c->N, 1.0f, c->a[D_LG], E, c->x, C, 1.0f, c->g[ROUTER],
                  C))
        return dt_model_fail_matmul(m, "moe router weights");
    return 0;
}

/* 6 per weight a token meets: the router's E C and its K experts' 2 C F
 * (SwiGLU's 3 C F). */
static double flops_of(int products, const dt_gpt_config *cfg)
{
    const double C = cfg->n_embd, E = cfg->moe.experts, K = cfg->moe.topk, F = ffn(cfg);
    return 6.0 * (E * C + K * products * C * F);
}

static double flops(const dt_gpt_config *cfg, int T)
{
    (void)T;
    return flops_of(2, cfg);
}

static double flops_swiglu(const dt_gpt_config *cfg, int T)
{
    (void)T;
    return flops_of(3, cfg);
}

const dt_block_kind dt_block_moe = {
    .name = "moe",
    .role = DT_BLOCK_BRANCH,
    .tensors = tensors,
    .acts = acts,
    .forward = forward,
    .backward = backward,
    .weights = weights,
    .flops = flops,
    .experts = 1,
};

const dt_block_kind dt_block_moe_swiglu = {
    .name = "moe_swiglu",
    .role = DT_BLOCK_BRANCH,
    .tensors = tensors_swiglu,
    .acts = acts_swiglu,
    .forward = forward,
    .backward = backward,
    .weights = weights,
    .flops = flops_swiglu,
    .wlayout = DT_LINEAR,
    .experts = 1,
};
