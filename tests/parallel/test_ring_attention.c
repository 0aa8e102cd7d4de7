/* Ring attention over the communicator against attention on the whole
 * sequence in one process: every rank builds the same qkv and dout,
 * computes dt_attention_forward / _backward on all T positions, takes its
 * own rows and checks the ring's out, lse and dqkv for them, for
 * contiguous and zig-zag sharding, odd sizes, and blocks of more than
 * ATTN_BLOCK (64) rows. Also: sizes that do not shard are refused on every
 * rank with a message, and ranks that disagree on the sizes get an error,
 * not a hang. Run under `dtrain launch -n N` (N = 2, 3, 4). */
#include "dtrain/comm.h"
#include "seq_rows_test.h"
#include "kernels/attention.h"
#include "kernels/threads.h"
#include "parallel/context/ring_attention.h"
#include "rank_test.h"

typedef struct {
    int B, T, C, NH;
    dt_shard_kind kind;
} config;

static double *my_rows(const float *full, size_t w, const dt_ring_attention *ra)
{
    return take_rows(full, w, ra->split.B, ra->split.T, ra->split.Tl, &ra->split.mine);
}

/* The same for lse-shaped [B, NH, T] arrays: rows of B * NH. */
static double *take_lse(const float *full, const dt_ring_attention *ra)
{
    const dt_seq_split *sp = &ra->split;
    double *y = dalloc((size_t)sp->B * sp->NH * sp->Tl);
    for (int bh = 0; bh < sp->B * sp->NH; bh++)
        for (int i = 0; i < sp->Tl; i++)
            y[(size_t)bh * sp->Tl + i] = full[(size_t)bh * sp->T + position(&sp->mine, i)];
    return y;
}

static double worst_err;

static void compare(const char *what, const float *got, const double *want, size_t n,
                    const config *c)
{
    double err = rel_error(got, want, n);
    if (err > worst_err) worst_err = err;
    CHECK_CLOSE(got, want, n, 1e-5, "%s%s %s B=%d T=%d C=%d NH=%d", check_label, what,
                kind_name(c->kind), c->B, c->T, c->C, c->NH);
}

/* The reference on the whole sequence, same inputs on every rank. */
static void reference(const config *c, float **qkv, float **dout, float **out, float **lse,
                      float **dqkv)
{
    size_t BT = (size_t)c->B * c->T;
    rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)(c->T * 31 + c->kind);
    *qkv = rnd_array(BT * 3 * c->C, 1.0f);
    *dout = rnd_array(BT * c->C, 1.0f);
    *out = malloc(BT * c->C * sizeof(float));
    *lse = malloc((size_t)c->B * c->NH * c->T * sizeof(float));
    *dqkv = malloc(BT * 3 * c->C * sizeof(float));
    dt_attention_forward(*out, *lse, *qkv, c->B, c->T, c->C, c->NH);
    dt_attention_backward(*dqkv, *dout, *qkv, *out, *lse, c->B, c->T, c->C, c->NH);
}

static void run_case(dt_comm *comm, const config *c)
{
    float *qkv, *dout, *want_out, *want_lse, *want_dqkv;
    reference(c, &qkv, &dout, &want_out, &want_lse, &want_dqkv);
    dt_ring_attention ra;
    int rc = dt_ring_attention_init(&ra, comm, c->B, c->T, c->C, c->NH, c->kind);
    CHECK(rc == 0, "init: %s", ra.error);
    if (rc) {
        free(qkv), free(dout), free(want_out), free(want_lse), free(want_dqkv);
        return;
    }
    size_t rows = (size_t)c->B * ra.split.Tl, C = c->C, nlse = rows * c->NH;
    double *my_qkv = my_rows(qkv, 3 * C, &ra), *my_dout = my_rows(dout, C, &ra);
    double *w_out = my_rows(want_out, C, &ra), *w_lse = take_lse(want_lse, &ra);
    double *w_dqkv = my_rows(want_dqkv, 3 * C, &ra);
    float *lq = narrow(my_qkv, rows * 3 * C), *ld = narrow(my_dout, rows * C);
    float *out = malloc(rows * C * sizeof(float)), *lse = malloc(nlse * sizeof(float));
    float *dqkv = malloc(rows * 3 * C * sizeof(float));
    rc = dt_ring_attention_forward(&ra, out, lse, lq);
    CHECK(rc == 0, "forward: %s", ra.error);
    if (rc == 0) {
        compare("out", out, w_out, rows * C, c);
        compare("lse", lse, w_lse, nlse, c);
        rc = dt_ring_attention_backward(&ra, dqkv, ld, lq, out, lse);
        CHECK(rc == 0, "backward: %s", ra.error);
        if (rc == 0) compare("dqkv", dqkv, w_dqkv, rows * 3 * C, c);
    }
    free(my_qkv), free(my_dout), free(w_out), free(w_lse), free(w_dqkv);
    free(lq), free(ld), free(out), free(lse), free(dqkv);
    free(qkv), free(dout), free(want_out), free(want_lse), free(want_dqkv);
}

/* Sizes that do not shard: refused on every rank, before any transfer. */
static void check_refusals(dt_comm *comm, int N)
{
    dt_ring_attention ra;
    char t[32], want[32];
    int T = 2 * N * 7 + 1;
    snprintf(t, sizeof t, "T = %d", T);
    snprintf(want, sizeof want, "T = %d or %d", 2 * N * 7, 2 * N * 8);
    CHECK_ERR(dt_ring_attention_init(&ra, comm, 2, T, 15, 3, DT_SHARD_ZIGZAG), ra.error, t,
              "zig-zag", want);
    T = N * 7 + (N > 1); /* not a multiple of N */
    snprintf(t, sizeof t, "T = %d", T);
    CHECK_ERR(dt_ring_attention_init(&ra, comm, 2, T, 15, 3, DT_SHARD_CONTIGUOUS), ra.error, t,
              "contiguous");
    T = N * 15; /* a multiple of N, not of 2N */
    CHECK(dt_ring_attention_init(&ra, comm, 2, T, 15, 3, DT_SHARD_CONTIGUOUS) == 0,
          "T = %d contiguous refused: %s", T, ra.error);
    snprintf(t, sizeof t, "T = %d", T);
    CHECK_ERR(dt_ring_attention_init(&ra, comm, 2, T, 15, 3, DT_SHARD_ZIGZAG), ra.error, t,
              "2N");
    CHECK_ERR(dt_ring_attention_init(&ra, comm, 2, 2 * N, 16, 3, DT_SHARD_ZIGZAG), ra.error,
              "C = 16", "NH = 3");
    /* Every rank refused alike and is still in step with the others. */
    CHECK(dt_barrier(comm) == 0, "barrier after refusals: %s", dt_comm_error(comm));
}

/* Rank 0 with a different B from the others: the block sizes disagree,
 * and the call must fail with the communicator's message. Last, as it
 * leaves the communicator failed. */
static void check_mismatch(dt_comm *comm, int rank, int N)
{
    int B = rank == 0 ? 2 : 1, T = 2 * N * 2, C = 4, NH = 2;
    dt_ring_attention ra;
    CHECK(dt_ring_attention_init(&ra, comm, B, T, C, NH, DT_SHARD_ZIGZAG) == 0, "%s", ra.error);
    size_t rows = (size_t)B * ra.split.Tl;
    float *qkv = calloc(rows * 3 * C, sizeof(float)), *out = malloc(rows * C * sizeof(float));
    float *lse = malloc(rows * NH * sizeof(float));
    int rc = dt_ring_attention_forward(&ra, out, lse, qkv);
    CHECK_ERR(rc, ra.error, "ring attention forward", "hop");
    printf("rank %d: mismatched sizes: %s\n", rank, ra.error);
    free(qkv), free(out), free(lse);
}

int main(void)
{
    int rank, N;
    dt_comm *comm = rank_test_start(&rank, &N);
    if (!comm) return 1;
    for (int k = 0; k < 2; k++) {
        dt_shard_kind kind = k ? DT_SHARD_ZIGZAG : DT_SHARD_CONTIGUOUS;
        config small = {.B = 2, .T = 2 * N * 7, .C = 15, .NH = 3, .kind = kind};
        config large = {.B = 1, .T = 2 * N * 35, .C = 16, .NH = 2, .kind = kind}; /* Tl = 70 */
        run_case(comm, &small);
        run_case(comm, &large);
    }
    printf("rank %d of %d: worst relative error (out, lse, dqkv) %.3g\n", rank, N, worst_err);
    check_refusals(comm, N);
    check_mismatch(comm, rank, N);
    dt_comm_destroy(comm);
    return finish("test_ring_attention");
}
