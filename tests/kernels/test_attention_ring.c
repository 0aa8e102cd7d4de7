/*
 * Ring attention's kernels, the ring simulated in one process: for N ranks
 * and contiguous or zig-zag sharding, each rank attends its query rows to
 * the key/value rows of rank (r - s) mod N at steps s = 0..N-1, merging
 * the partial results; backward accumulates dq on the rank and dk, dv on
 * the rows' owner over the same block pairs. Every rank's rows, put back
 * in sequence order, must match dt_attention_forward / _backward on the
 * whole sequence (themselves checked against double in test_attention).
 * Also: a block pair wholly above the diagonal does nothing, and the work
 * per rank is balanced under zig-zag and not under contiguous sharding.
 */
#include "kernel_test.h"
#include "kernels/attention.h"
#include "kernels/attention_ring.h"
#include "kernels/threads.h"

typedef struct {
    int N, B, T, C, NH;
    dt_shard_kind kind;
} config;

/* One rank's rows, gathered from the whole sequence. */
typedef struct {
    dt_seq_rows rows;
    int T;           /* rows per sequence */
    float *qkv;      /* [B, T, 3C] */
    float *kv;       /* [B, T, 2C]: k and v, what travels the ring */
    float *dout;     /* [B, T, C] */
    float *out, *lse, *D;
    float *dqkv;     /* [B, T, 3C]: dq used */
    float *dkv;      /* [B, T, 2C]: gathered from every rank's steps */
    int work_fwd, work_bwd;
} rank_state;

static int position(const dt_seq_rows *rows, int row)
{
    for (int c = 0; c < rows->count; c++) {
        if (row < rows->len[c]) return rows->begin[c] + row;
        row -= rows->len[c];
    }
    return -1;
}

/* local[b, i, 0:w] = full[b, position(i), off:off+w] of this rank's row i,
 * or the reverse when scatter; rows ld_local and ld_full apart. */
static void move_rows(float *local, size_t ld_local, float *full, size_t ld_full, size_t off,
                      size_t w, const rank_state *r, const config *c, int scatter)
{
    for (int b = 0; b < c->B; b++)
        for (int i = 0; i < r->T; i++) {
            float *l = local + ((size_t)b * r->T + i) * ld_local;
            float *f = full + ((size_t)b * c->T + position(&r->rows, i)) * ld_full + off;
            if (scatter)
                memcpy(f, l, w * sizeof(float));
            else
                memcpy(l, f, w * sizeof(float));
        }
}

/* lse-shaped [B, NH, T] rows, moved the same way */
static void move_lse(float *local, float *full, const rank_state *r, const config *c,
                     int scatter)
{
    for (int bh = 0; bh < c->B * c->NH; bh++)
        for (int i = 0; i < r->T; i++) {
            float *l = local + (size_t)bh * r->T + i;
            float *f = full + (size_t)bh * c->T + position(&r->rows, i);
            if (scatter)
                *f = *l;
            else
                *l = *f;
        }
}

static void rank_init(rank_state *r, const config *c, int rank, float *qkv, float *dout)
{
    int rc = dt_seq_shard(&r->rows, c->T, rank, c->N, c->kind);
    CHECK(rc == 0, "shard rank %d of %d, T = %d", rank, c->N, c->T);
    r->T = dt_seq_rows_total(&r->rows);
    size_t rows = (size_t)c->B * r->T, C = c->C;
    r->qkv = malloc(rows * 3 * C * sizeof(float));
    r->kv = malloc(rows * 2 * C * sizeof(float));
    r->dout = malloc(rows * C * sizeof(float));
    r->out = calloc(rows * C, sizeof(float));
    r->lse = malloc(rows * c->NH * sizeof(float));
    r->D = malloc(rows * c->NH * sizeof(float));
    r->dqkv = calloc(rows * 3 * C, sizeof(float));
    r->dkv = calloc(rows * 2 * C, sizeof(float));
    for (size_t i = 0; i < rows * c->NH; i++) r->lse[i] = -INFINITY;
    move_rows(r->qkv, 3 * C, qkv, 3 * C, 0, 3 * C, r, c, 0);
    move_rows(r->kv, 2 * C, qkv, 3 * C, C, 2 * C, r, c, 0);
    move_rows(r->dout, C, dout, C, 0, C, r, c, 0);
    r->work_fwd = r->work_bwd = 0;
}

static void rank_free(rank_state *r)
{
    free(r->qkv), free(r->kv), free(r->dout), free(r->out), free(r->lse), free(r->D);
    free(r->dqkv), free(r->dkv);
}

/* Rank `me`'s forward over the ring; a call without work must leave its
 * outputs as they were (NaN here, which the merge would spread). */
static void ring_forward(rank_state *ranks, int me, const config *c)
{
    rank_state *r = &ranks[me];
    size_t n_out = (size_t)c->B * r->T * c->C, n_lse = (size_t)c->B * c->NH * r->T;
    float *part = malloc(n_out * sizeof(float)), *part_lse = malloc(n_lse * sizeof(float));
    for (int s = 0; s < c->N; s++) {
        const rank_state *src = &ranks[(me - s + c->N) % c->N];
        for (size_t i = 0; i < n_out; i++) part[i] = NAN;
        for (size_t i = 0; i < n_lse; i++) part_lse[i] = NAN;
        int work = dt_attention_block_forward(part, part_lse, r->qkv, 3 * (size_t)c->C, src->kv,
                                              src->kv + c->C, 2 * (size_t)c->C, &r->rows,
                                              &src->rows, c->B, c->C, c->NH);
        CHECK(work == dt_seq_pairs_with_work(&r->rows, &src->rows), "forward work %d", work);
        r->work_fwd += work;
        if (work) {
            dt_attention_merge(r->out, r->lse, part, part_lse, c->B, r->T, c->C, c->NH);
            continue;
        }
        int untouched = 1;
        for (size_t i = 0; i < n_out; i++) untouched &= isnan(part[i]);
        for (size_t i = 0; i < n_lse; i++) untouched &= isnan(part_lse[i]);
        CHECK(untouched, "rank %d step %d: no work yet outputs written", me, s);
    }
    free(part), free(part_lse);
}

static void ring_backward(rank_state *ranks, int me, const config *c)
{
    rank_state *r = &ranks[me];
    size_t C = c->C;
    dt_attention_row_dots(r->D, r->dout, r->out, c->B, r->T, c->C, c->NH);
    for (int s = 0; s < c->N; s++) {
        rank_state *src = &ranks[(me - s + c->N) % c->N];
        r->work_bwd += dt_attention_block_backward(
            r->dqkv, src->dkv, src->dkv + C, r->dout, r->lse, r->D, r->qkv, 3 * C, src->kv,
            src->kv + C, 2 * C, &r->rows, &src->rows, c->B, c->C, c->NH);
    }
}

static double *to_double(const float *x, size_t n)
{
    double *y = dalloc(n);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

static float *filled(size_t n, float value)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = value;
    return x;
}

/* part (0: q, 1: k, 2: v) of a [rows, 3C] array, contiguous */
static float *third(const float *x, size_t rows, size_t C, int part)
{
    float *y = malloc(rows * C * sizeof(float));
    for (size_t i = 0; i < rows; i++)
        memcpy(y + i * C, x + (i * 3 + part) * C, C * sizeof(float));
    return y;
}

static void compare(const char *what, const float *got, const float *want, size_t n,
                    const config *c, double *worst)
{
    double *w = to_double(want, n), err = rel_error(got, w, n);
    if (err > *worst) *worst = err;
    CHECK_CLOSE(got, w, n, 1e-5, "%s N=%d %s T=%d C=%d NH=%d", what, c->N,
                c->kind == DT_SHARD_ZIGZAG ? "zigzag" : "contiguous", c->T, c->C, c->NH);
    free(w);
}

/* The balance zig-zag exists for: each rank computes 2N + 1 chunk pairs
 * (its chunk r sees chunks 0..r, chunk 2N-1-r sees 0..2N-1-r); contiguous
 * rank r computes r + 1, so the ranks differ. */
static void check_balance(const rank_state *ranks, const config *c)
{
    int all_equal = 1;
    for (int r = 0; r < c->N; r++) {
        int want = c->kind == DT_SHARD_ZIGZAG ? 2 * c->N + 1 : r + 1;
        CHECK(ranks[r].work_fwd == want && ranks[r].work_bwd == want,
              "N=%d rank %d: work %d forward, %d backward, want %d", c->N, r, ranks[r].work_fwd,
              ranks[r].work_bwd, want);
        all_equal &= ranks[r].work_fwd == ranks[0].work_fwd;
    }
    CHECK(all_equal == (c->kind == DT_SHARD_ZIGZAG), "N=%d: balanced %d", c->N, all_equal);
}

static void gather_results(float *out, float *lse, float *dqkv, const rank_state *ranks,
                           const config *c)
{
    size_t C = c->C;
    for (int r = 0; r < c->N; r++) {
        const rank_state *rk = &ranks[r];
        move_rows(rk->out, C, out, C, 0, C, rk, c, 1);
        move_lse(rk->lse, lse, rk, c, 1);
        move_rows(rk->dqkv, 3 * C, dqkv, 3 * C, 0, C, rk, c, 1);
        move_rows(rk->dkv, 2 * C, dqkv, 3 * C, C, 2 * C, rk, c, 1);
    }
}

static void check_config(const config *c, double worst[3])
{
    size_t rows = (size_t)c->B * c->T, n_lse = rows * c->NH, C = c->C;
    float *qkv = rnd_array(rows * 3 * C, 2.0f), *dout = rnd_array(rows * C, 1.0f);
    float *want_out = filled(rows * C, 0), *want_lse = filled(n_lse, 0);
    float *want_dqkv = filled(rows * 3 * C, 0);
    dt_attention_forward(want_out, want_lse, qkv, c->B, c->T, c->C, c->NH);
    dt_attention_backward(want_dqkv, dout, qkv, want_out, want_lse, c->B, c->T, c->C, c->NH);
    rank_state ranks[8];
    for (int r = 0; r < c->N; r++) rank_init(&ranks[r], c, r, qkv, dout);
    for (int r = 0; r < c->N; r++) ring_forward(ranks, r, c);
    for (int r = 0; r < c->N; r++) ring_backward(ranks, r, c);
    check_balance(ranks, c);
    /* NaN where no rank put a row: a gap in the sharding fails the compare */
    float *out = filled(rows * C, NAN), *lse = filled(n_lse, NAN);
    float *dqkv = filled(rows * 3 * C, NAN);
    gather_results(out, lse, dqkv, ranks, c);
    compare("out", out, want_out, rows * C, c, &worst[0]);
    compare("lse", lse, want_lse, n_lse, c, &worst[1]);
    for (int part = 0; part < 3; part++) {
        static const char *names[] = {"dq", "dk", "dv"};
        float *got = third(dqkv, rows, C, part), *want = third(want_dqkv, rows, C, part);
        compare(names[part], got, want, rows * C, c, &worst[2]);
        free(got), free(want);
    }
    for (int r = 0; r < c->N; r++) rank_free(&ranks[r]);
    free(qkv), free(dout), free(want_out), free(want_lse), free(want_dqkv);
    free(out), free(lse), free(dqkv);
}

/* Queries [0, 7) against keys [7, 14): no work, nothing written, forward
 * or backward. Keys from 6 on: only the last query sees one key, so its
 * output is that key's v and its lse the one scaled score; the others see
 * nothing (out 0, lse -inf). */
static void check_edges(void)
{
    const int B = 2, C = 15, NH = 3, HS = 5, T = 7;
    size_t n = (size_t)B * T;
    float *q = rnd_array(n * 3 * C, 2.0f), *kv = rnd_array(n * 2 * C, 2.0f);
    float *out = filled(n * C, 7.0f), *lse = filled(n * NH, 7.0f), *D = rnd_array(n * NH, 1.0f);
    float *dout = rnd_array(n * C, 1.0f), *dq = filled(n * 3 * C, 7.0f);
    float *dkv = filled(n * 2 * C, 7.0f);
    dt_seq_rows qr = dt_seq_span(0, T), above = dt_seq_span(T, T);
    dt_seq_rows touching = dt_seq_span(T - 1, T);
    int fwd = dt_attention_block_forward(out, lse, q, 3 * C, kv, kv + C, 2 * C, &qr, &above, B, C,
                                         NH);
    int bwd = dt_attention_block_backward(dq, dkv, dkv + C, dout, lse, D, q, 3 * C, kv, kv + C,
                                          2 * C, &qr, &above, B, C, NH);
    int untouched = 1;
    for (size_t i = 0; i < n * C; i++) untouched &= out[i] == 7.0f;
    for (size_t i = 0; i < n * NH; i++) untouched &= lse[i] == 7.0f;
    for (size_t i = 0; i < n * 3 * C; i++) untouched &= dq[i] == 7.0f;
    for (size_t i = 0; i < n * 2 * C; i++) untouched &= dkv[i] == 7.0f;
    CHECK(fwd == 0 && bwd == 0 && untouched, "above the diagonal: work %d %d, untouched %d", fwd,
          bwd, untouched);
    CHECK(dt_attention_block_forward(out, lse, q, 3 * C, kv, kv + C, 2 * C, &qr, &touching, B, C,
                                     NH) == 1, "one key under the diagonal: no work reported");
    double worst = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *qt = q + ((size_t)b * T + t) * 3 * C + h * HS;
                const float *k0 = kv + (size_t)b * T * 2 * C + h * HS, *v0 = k0 + C;
                const float *o = out + ((size_t)b * T + t) * C + h * HS;
                float l = lse[((size_t)b * NH + h) * T + t];
                double dot = 0.0;
                for (int j = 0; j < HS; j++) dot += (double)qt[j] * k0[j];
                double want_lse = t == T - 1 ? dot / sqrt(HS) : -INFINITY;
                CHECK(t == T - 1 ? fabs(l - want_lse) < 1e-5 : l == -INFINITY,
                      "edge lse b=%d h=%d t=%d: %g, want %g", b, h, t, l, want_lse);
                for (int j = 0; j < HS; j++) {
                    double e = fabs(o[j] - (t == T - 1 ? v0[j] : 0.0f));
                    if (e > worst) worst = e;
                }
            }
    CHECK(worst <= 1e-6, "edge out: error %g", worst);
    free(q), free(kv), free(out), free(lse), free(D), free(dout), free(dq), free(dkv);
}

/* Shards, kinds, and a bad T refused. */
static void check_shards(void)
{
    dt_seq_rows rows;
    CHECK(dt_seq_shard(&rows, 56, 1, 4, DT_SHARD_ZIGZAG) == 0 && rows.count == 2 &&
              rows.begin[0] == 7 && rows.begin[1] == 42 && rows.len[0] == 7 && rows.len[1] == 7,
          "zig-zag rank 1 of 4");
    CHECK(dt_seq_shard(&rows, 56, 3, 4, DT_SHARD_CONTIGUOUS) == 0 && rows.count == 1 &&
              rows.begin[0] == 42 && rows.len[0] == 14, "contiguous rank 3 of 4");
    CHECK(dt_seq_shard(&rows, 12, 0, 4, DT_SHARD_ZIGZAG) == -1 && rows.count == 0,
          "T = 12 over 4 zig-zag accepted");
    CHECK(dt_seq_shard(&rows, 12, 4, 4, DT_SHARD_CONTIGUOUS) == -1, "rank 4 of 4 accepted");
}

int main(void)
{
    /* B, T, C, NH: T = 2N * 7 with HS 5 or 8; then chunks wider than the
     * 64-row sub-blocks, and a head of 64 */
    static const config configs[] = {
        {2, 2, 28, 15, 3, 0}, {3, 2, 42, 24, 3, 0}, {4, 2, 56, 15, 3, 0},
        {2, 2, 280, 24, 3, 0}, {3, 1, 300, 128, 2, 0},
    };
    double worst[3] = {0.0, 0.0, 0.0};
    check_shards();
    check_edges();
    for (int threads = 1; threads <= 2; threads++) {
        dt_kernels_set_threads(threads);
        for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
            for (int kind = 0; kind < 2; kind++) {
                config c = configs[i];
                c.kind = kind ? DT_SHARD_ZIGZAG : DT_SHARD_CONTIGUOUS;
                check_config(&c, worst);
            }
    }
    printf("largest relative errors: out %.2e, lse %.2e, dqkv %.2e\n", worst[0], worst[1],
           worst[2]);
    return finish("test_attention_ring");
}
