/* Ulysses attention over the communicator against attention on the whole
 * sequence in one process: every rank builds the same qkv and dout,
 * computes dt_attention_forward / _backward on all T positions, and checks
 * Ulysses' out and dqkv for its own rows, and the log-sum-exp forward saved
 * for its own heads, for contiguous and zig-zag sharding, odd head sizes,
 * NH = N and 2N, and more than ATTN_BLOCK (64) rows. Also: the bytes the
 * four all-to-alls sent against the formula; sizes that do not shard
 * refused on every rank with a message naming them; ranks that disagree on
 * the sizes get an error, not a hang. Run under `dtrain launch -n N`
 * (N = 2, 3, 4). */
#include "dtrain/comm.h"
#include "seq_rows_test.h"
#include "kernels/attention.h"
#include "kernels/threads.h"
#include "parallel/context/ulysses.h"
#include "rank_test.h"

typedef struct {
    int B, T, NH, HS;
    dt_shard_kind kind;
} config;

static double *my_rows(const float *full, size_t w, const dt_ulysses *u)
{
    return take_rows(full, w, u->split.B, u->split.T, u->split.Tl, &u->split.mine);
}

/* The rank's heads [B, NH/N, T] of a full lse [B, NH, T], in double. */
static double *my_heads_lse(const float *full, const dt_ulysses *u)
{
    size_t nh = (size_t)u->split.NH / u->split.nranks, T = (size_t)u->split.T;
    double *y = dalloc((size_t)u->split.B * nh * T);
    for (size_t b = 0; b < (size_t)u->split.B; b++)
        for (size_t h = 0; h < nh; h++) {
            const float *f = full + (b * u->split.NH + u->split.rank * nh + h) * T;
            for (size_t t = 0; t < T; t++) y[(b * nh + h) * T + t] = f[t];
        }
    return y;
}

static double worst_err;

static void compare(const char *what, const float *got, const double *want, size_t n,
                    const config *c)
{
    double err = rel_error(got, want, n);
    if (err > worst_err) worst_err = err;
    CHECK_CLOSE(got, want, n, 1e-5, "%s%s %s B=%d T=%d NH=%d HS=%d", check_label, what,
                kind_name(c->kind), c->B, c->T, c->NH, c->HS);
}

/* The whole-sequence reference, the same on every rank: qkv, dout, then
 * out, lse, dqkv. */
typedef struct {
    float *qkv, *dout, *out, *lse, *dqkv;
} reference;

static reference make_reference(const config *c)
{
    size_t BT = (size_t)c->B * c->T, C = (size_t)c->NH * c->HS;
    rng_state = 0x2545f4914f6cdd1dull ^ (uint64_t)(c->T * 131 + c->NH * 7 + c->kind);
    reference r = {rnd_array(BT * 3 * C, 1.0f), rnd_array(BT * C, 1.0f),
                   malloc(BT * C * sizeof(float)),
                   malloc((size_t)c->B * c->NH * c->T * sizeof(float)),
                   malloc(BT * 3 * C * sizeof(float))};
    dt_attention_forward(r.out, r.lse, r.qkv, c->B, c->T, (int)C, c->NH);
    dt_attention_backward(r.dqkv, r.dout, r.qkv, r.out, r.lse, c->B, c->T, (int)C, c->NH);
    return r;
}

static void free_reference(reference *r)
{
    free(r->qkv), free(r->dout), free(r->out), free(r->lse), free(r->dqkv);
}

/* Each all-to-all sends (N-1)/N of the rank's buffer: qkv and dqkv of
 * [B, Tl, 3C], out and dout of [B, Tl, C]. */
static void check_bytes(const dt_ulysses *u)
{
    size_t N = (size_t)u->split.nranks, local = (size_t)u->split.B * u->split.Tl * u->split.C;
    size_t want = (N - 1) * (2 * 3 * local + 2 * local) / N * sizeof(float);
    CHECK(u->bytes_sent == want, "%sbytes sent %zu, want %zu (B=%d T=%d C=%d)", check_label,
          u->bytes_sent, want, u->split.B, u->split.T, u->split.C);
}

/* forward and backward on this rank's rows, checked against r. */
static void check_against(dt_ulysses *u, const reference *r, const config *c)
{
    size_t rows = (size_t)u->split.B * u->split.Tl, C = (size_t)u->split.C;
    double *in_qkv = my_rows(r->qkv, 3 * C, u), *in_dout = my_rows(r->dout, C, u);
    double *w_out = my_rows(r->out, C, u), *w_dqkv = my_rows(r->dqkv, 3 * C, u);
    double *w_lse = my_heads_lse(r->lse, u);
    float *qkv = narrow(in_qkv, rows * 3 * C), *dout = narrow(in_dout, rows * C);
    float *out = malloc(rows * C * sizeof(float)), *dqkv = malloc(rows * 3 * C * sizeof(float));
    const dt_seq_split *sp = &u->split;
    size_t nsaved = dt_ulysses_saved_floats(u);
    size_t nlse = (size_t)sp->B * (sp->NH / sp->nranks) * sp->T;
    float *saved = malloc(nsaved * sizeof(float));
    int rc = dt_ulysses_forward(u, out, qkv, saved);
    CHECK(rc == 0, "forward: %s", u->error);
    if (rc == 0) {
        compare("out", out, w_out, rows * C, c);
        compare("saved lse", saved + nsaved - nlse, w_lse, nlse, c);
        rc = dt_ulysses_backward(u, dqkv, dout, saved);
        CHECK(rc == 0, "backward: %s", u->error);
    }
    if (rc == 0) {
        compare("dqkv", dqkv, w_dqkv, rows * 3 * C, c);
        check_bytes(u);
    }
    free(in_qkv), free(in_dout), free(w_out), free(w_dqkv), free(w_lse);
    free(qkv), free(dout), free(out), free(dqkv), free(saved);
}

static void run_case(dt_comm *comm, const config *c)
{
    dt_ulysses u;
    int rc = dt_ulysses_init(&u, comm, c->B, c->T, c->NH * c->HS, c->NH, c->kind);
    CHECK(rc == 0, "init %s B=%d T=%d NH=%d HS=%d: %s", kind_name(c->kind), c->B, c->T, c->NH,
          c->HS, u.error);
    if (rc) return;
    reference r = make_reference(c);
    check_against(&u, &r, c);
    free_reference(&r);
}

/* Heads that N does not divide, with the sizes that would, worked out by
 * hand for each N the test runs under. */
static void check_heads_refused(dt_comm *comm, int N)
{
    static const struct {
        int N, NH;
        const char *would_work;
    } cases[] = {{2, 9, "N = 1, 3 or 9 would work"},
                 {3, 10, "N = 1, 2, 5 or 10 would work"},
                 {4, 6, "N = 1, 2, 3 or 6 would work"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].N != N) continue;
        dt_ulysses u;
        char nh[32], n[32];
        snprintf(nh, sizeof nh, "heads (NH = %d)", cases[i].NH);
        snprintf(n, sizeof n, "size (N = %d)", N);
        CHECK_ERR(dt_ulysses_init(&u, comm, 2, 4 * N, cases[i].NH * 5, cases[i].NH,
                                  DT_SHARD_CONTIGUOUS),
                  u.error, nh, n, cases[i].would_work);
    }
}

/* Sizes that do not shard: refused on every rank, before any transfer. */
static void check_refusals(dt_comm *comm, int N)
{
    dt_ulysses u;
    char t[32], want[48];
    check_heads_refused(comm, N);
    int T = N * 7 + 1, C = 5 * N;
    snprintf(t, sizeof t, "T = %d", T);
    snprintf(want, sizeof want, "T = %d or %d would work", N * 7, N * 8);
    CHECK_ERR(dt_ulysses_init(&u, comm, 2, T, C, N, DT_SHARD_CONTIGUOUS), u.error, t,
              "contiguous", want);
    T = N * 15; /* a multiple of N, not of 2N */
    CHECK(dt_ulysses_init(&u, comm, 2, T, C, N, DT_SHARD_CONTIGUOUS) == 0,
          "T = %d contiguous refused: %s", T, u.error);
    snprintf(t, sizeof t, "T = %d", T);
    snprintf(want, sizeof want, "T = %d or %d would work", N * 14, N * 16);
    CHECK_ERR(dt_ulysses_init(&u, comm, 2, T, C, N, DT_SHARD_ZIGZAG), u.error, t, "2N",
              "zig-zag", want);
    CHECK_ERR(dt_ulysses_init(&u, comm, 0, 2 * N, C, N, DT_SHARD_ZIGZAG), u.error, "B = 0");
    CHECK_ERR(dt_ulysses_init(&u, comm, 2, 2 * N, 16, 3, DT_SHARD_ZIGZAG), u.error, "C = 16",
              "NH = 3");
    /* Every rank refused alike and is still in step with the others. */
    CHECK(dt_barrier(comm) == 0, "barrier after refusals: %s", dt_comm_error(comm));
}

/* Rank 0 with a different B from the others: the all-to-all counts
 * disagree, and the call must fail with the communicator's message. Last,
 * as it leaves the communicator failed. */
static void check_mismatch(dt_comm *comm, int rank, int N)
{
    int B = rank == 0 ? 2 : 1, T = 2 * N * 2, NH = N, C = 2 * NH;
    dt_ulysses u;
    CHECK(dt_ulysses_init(&u, comm, B, T, C, NH, DT_SHARD_ZIGZAG) == 0, "%s", u.error);
    size_t rows = (size_t)B * u.split.Tl;
    float *qkv = calloc(rows * 3 * C, sizeof(float)), *out = malloc(rows * C * sizeof(float));
    float *saved = malloc(dt_ulysses_saved_floats(&u) * sizeof(float));
    int rc = dt_ulysses_forward(&u, out, qkv, saved);
    CHECK_ERR(rc, u.error, "ulysses attention forward qkv all-to-all");
    printf("rank %d: mismatched sizes: %s\n", rank, u.error);
    free(qkv), free(out), free(saved);
}

int main(void)
{
    int rank, N;
    dt_comm *comm = rank_test_start(&rank, &N);
    if (!comm) return 1;
    for (int k = 0; k < 2; k++) {
        dt_shard_kind kind = k ? DT_SHARD_ZIGZAG : DT_SHARD_CONTIGUOUS;
        int odd = k ? 2 * N * 7 : N * 7; /* 7 positions a chunk */
        config one_head = {.B = 2, .T = odd, .NH = N, .HS = 5, .kind = kind};
        config two_heads = {.B = 2, .T = odd, .NH = 2 * N, .HS = 7, .kind = kind};
        config large = {.B = 1, .T = 2 * N * 35, .NH = N, .HS = 8, .kind = kind}; /* Tl = 70 */
        run_case(comm, &one_head);
        run_case(comm, &two_heads);
        run_case(comm, &large);
    }
    printf("rank %d of %d: worst relative error (out, lse, dqkv) %.3g\n", rank, N, worst_err);
    if (N >= 2 && N <= 4) check_refusals(comm, N);
    check_mismatch(comm, rank, N);
    dt_comm_destroy(comm);
    return finish("test_ulysses");
}
