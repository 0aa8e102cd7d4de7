/* The embeddings: the token (wte) and position (wpe) tables, looked up
 * into the first layer's input and their gradients added back; the rows a
 * context-parallel rank picks of each sequence. Split over the vocabulary
 * (tensor parallelism), each rank looks up the tokens of its slice, zeros
 * for the rest, and the group's sum is the whole lookup. See gpt.h. */
#include <string.h>

#include "core/str.h"
#include "kernels/embedding.h"
#include "model/model_internal.h"

static float *wte(const dt_gpt *m, float *flat) { return flat + m->tensors[0].offset; }
/* Learned positions' table at position pos, or NULL (the family rotates
 * its attention's queries and keys instead). */
static float *wpe(const dt_gpt *m, float *flat, int pos)
{
    if (m->embed_tensors < 2) return NULL;
    return flat + m->tensors[1].offset + (size_t)pos * m->cfg.n_embd;
}

/* Calls fn on each run of consecutive positions among this rank's rows
 * of b sequences of t rows: sequence bi, its rows from `row` on (of the
 * b x t), positions [pos, pos + len). Whole sequences are one run of b. */
typedef void (*rows_fn)(dt_gpt *m, const void *arg, size_t row, int pos, int nseq, int len);

static void each_run(dt_gpt *m, int b, int t, rows_fn fn, const void *arg)
{
    if (m->cp.size == 1) {
        fn(m, arg, 0, 0, b, t);
        return;
    }
    const dt_seq_rows *rows = &m->cp.rows;
    for (int bi = 0; bi < b; bi++)
        for (int c = 0, off = 0; c < rows->count; off += rows->len[c++])
            fn(m, arg, (size_t)bi * t + off, rows->begin[c], 1, rows->len[c]);
}

/* The embeddings of some rows (out [rows, C]) or their gradient d. */
typedef struct {
    float *out;
    const float *d;
    const int32_t *tokens;
} embed_rows;

static void embed_run(dt_gpt *m, const void *arg, size_t row, int pos, int nseq, int len)
{
    const embed_rows *e = arg;
    const int C = m->cfg.n_embd;
    float *w = dt_model_weights(m, 0); /* the embeddings' segment starts the layout */
    dt_embedding_forward_range(e->out + row * C, e->tokens + row, wte(m, w), wpe(m, w, pos),
                               nseq, len, C, m->tp.v0, m->tp.vocab);
}

/* The embeddings' output into encoded, of b x t rows (this rank's
 * positions); with sequence parallelism the sum of this rank's rows alone. */
int dt_model_embed_forward(dt_gpt *m, const int32_t *tokens, int b, int t)
{
    const int C = m->cfg.n_embd, N = b * t;
    float *encoded = m->acts.encoded;
    embed_rows e = {m->tp.sp ? m->acts.sp_full : encoded, NULL, tokens};
    each_run(m, b, t, embed_run, &e);
    if (!m->tp.sp) return dt_model_tp_reduce(m, encoded, (size_t)N * C, DT_TP_SUM_F32, "wte");
    if (dt_model_tp_reduce(m, e.out, (size_t)N * C, DT_TP_SCATTER_SUM_F32, "wte")) return -1;
    memcpy(encoded, e.out, dt_model_region_rows(m, (size_t)N) * C * sizeof(float));
    return 0;
}

/* Context parallelism: this rank's rows of b whole sequences of t, into
 * slot k's tokens and targets in m->cp (either may be NULL). */
int dt_model_pick_rows(dt_gpt *m, int k, const int32_t *tokens, const int32_t *targets, int b,
                       int t)
{
    dt_seq_rows *rows = &m->cp.rows;
    const size_t slot = (size_t)k * (size_t)m->acts.B * (size_t)dt_gpt_rows(m, m->acts.T);
    if (dt_seq_shard(rows, t, m->cp.rank, m->cp.size, m->cp.kind))
        return dt_strf(m->error, sizeof m->error, "model: sequences of %d do not split over "
                       "%d ranks of context parallelism", t, m->cp.size), -1;
    const int tl = dt_seq_rows_total(rows);
    for (int bi = 0; bi < b; bi++)
        for (int c = 0, off = 0; c < rows->count; off += rows->len[c++]) {
            size_t from = (size_t)bi * t + rows->begin[c], to = slot + (size_t)bi * tl + off;
            size_t bytes = (size_t)rows->len[c] * sizeof(int32_t);
            if (tokens) memcpy(m->cp.tokens + to, tokens + from, bytes);
            if (targets) memcpy(m->cp.targets + to, targets + from, bytes);
        }
    return 0;
}

/* The embeddings' gradients from that of their output, d [b*t, C] (whole
 * on every rank of tensor parallelism, gathered first under sequence
 * parallelism: each adds its vocabulary slice's rows and all of wpe;
 * context parallelism: its rows' positions). */
static void embed_grad_run(dt_gpt *m, const void *arg, size_t row, int pos, int nseq, int len)
{
    const embed_rows *g = arg;
    const int C = m->cfg.n_embd;
    float *grads = dt_model_grads_of(m, 0); /* segment 0 starts the layout */
    dt_embedding_backward_range(wte(m, grads), wpe(m, grads, pos), g->d + row * C,
                                g->tokens + row, nseq, len, C, m->tp.v0, m->tp.vocab);
}

int dt_model_embed_backward(dt_gpt *m, const float *d, const dt_gpt_slot *st)
{
    embed_rows g = {NULL, dt_model_rows_gathered(m, d, st->b * st->t, "wte backward"),
                    st->row_tokens};
    if (!g.d || dt_model_grads_open(m, 0)) return -1;
    each_run(m, st->b, st->t, embed_grad_run, &g);
    dt_model_segment_done(m, 0);
    return 0;
}
