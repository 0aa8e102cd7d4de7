/* Activation recomputation (gpt.h, dt_recompute):
 *  - selective and full give the losses and every gradient of none, bit for
 *    bit (memcmp), in fp32 and bf16, over micro-batch shapes that fill the
 *    arena and that use part of it, with gradients accumulated over two
 *    micro-batches;
 *  - the arena each mode carves (dt_gpt_acts_floats) holds what the
 *    closed-form count says: L layers of dt_gpt_layer_act_bytes, one shared
 *    layer, and the part no mode changes, here written out again from the
 *    list of buffers (4 (11 N C + 3 N + N V) bytes), not taken from the
 *    carve;
 *  - mode names parse, and a mode changed after allocation re-carves. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/threads.h"
#include "model/gpt.h"

enum { L = 3, NH = 4, C = 32, V = 67, BLOCK = 32 };

static const dt_recompute modes[] = {DT_RECOMPUTE_NONE, DT_RECOMPUTE_SELECTIVE,
                                     DT_RECOMPUTE_FULL};

typedef struct {
    double loss[2];
    float *grads;
    size_t n;
} result;

static void fill_tokens(int32_t *tok, size_t n, uint64_t seed)
{
    rng_state = seed;
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)(rnd_u64() % V);
}

/* Two micro-batches (B x T, then b2 x t2 inside the same arena), gradients
 * accumulated, in `mode`. 0 or -1. */
static int run(dt_recompute mode, dt_precision prec, int B, int T, int b2, int t2, result *r)
{
    dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C,
                         .vocab_size = V, .block_size = BLOCK};
    dt_gpt m;
    char err[256];
    if (dt_gpt_create(&m, &cfg, prec, err, sizeof err)) {
        CHECK(0, "create: %s", err);
        return -1;
    }
    dt_gpt_init_weights(&m, 42);
    m.acts.recompute = mode;
    int rc = -1;
    int32_t *tok = malloc(4 * (size_t)B * T * sizeof *tok);
    if (!tok || dt_gpt_alloc_grads(&m) || dt_gpt_alloc_acts(&m, B, T)) {
        CHECK(0, "alloc: %s", m.error);
        goto out;
    }
    memset(m.grads, 0, m.n_floats * sizeof(float));
    const int shape[2][2] = {{B, T}, {b2, t2}};
    for (int k = 0; k < 2; k++) {
        size_t n = (size_t)shape[k][0] * shape[k][1];
        fill_tokens(tok, 2 * n, 1000 + 17 * (uint64_t)k);
        r->loss[k] = dt_gpt_forward(&m, tok, tok + n, shape[k][0], shape[k][1]);
        if (r->loss[k] < 0 ||
            dt_gpt_backward(&m, tok, shape[k][0], shape[k][1], 1.0f / (float)(2 * n))) {
            CHECK(0, "%s: forward/backward: %s", dt_recompute_name(mode), m.error);
            goto out;
        }
    }
    r->n = m.n_floats;
    r->grads = malloc(r->n * sizeof(float));
    if (r->grads) memcpy(r->grads, m.grads, r->n * sizeof(float)), rc = 0;
out:
    free(tok);
    dt_gpt_destroy(&m);
    return rc;
}

static void test_bit_identical(void)
{
    const int shapes[][4] = {
        {2, 16, 2, 16}, /* the same shape twice */
        {3, 7, 1, 5},   /* odd sizes, then part of the arena */
        {2, 32, 1, 9},  /* the whole block; a smaller second micro-batch */
    };
    const dt_precision precs[] = {DT_PREC_F32, DT_PREC_BF16};
    for (size_t p = 0; p < 2; p++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int *sh = shapes[s];
            check_set_label("%s %dx%d then %dx%d: ", precs[p] == DT_PREC_BF16 ? "bf16" : "fp32",
                            sh[0], sh[1], sh[2], sh[3]);
            result ref = {0};
            if (run(DT_RECOMPUTE_NONE, precs[p], sh[0], sh[1], sh[2], sh[3], &ref)) continue;
            for (size_t k = 1; k < 3; k++) {
                result r = {0};
                const char *name = dt_recompute_name(modes[k]);
                if (run(modes[k], precs[p], sh[0], sh[1], sh[2], sh[3], &r)) continue;
                for (int mb = 0; mb < 2; mb++)
                    CHECK(!memcmp(&r.loss[mb], &ref.loss[mb], sizeof(double)),
                          "%s: loss of micro-batch %d %.17g, none's %.17g", name, mb,
                          r.loss[mb], ref.loss[mb]);
                size_t diff = 0, first = 0;
                for (size_t i = r.n; i-- > 0;)
                    if (memcmp(&r.grads[i], &ref.grads[i], sizeof(float))) diff++, first = i;
                CHECK(diff == 0, "%s: %zu of %zu gradients differ from none's, first at float "
                      "%zu (%.9g vs %.9g)", name, diff, r.n, first, r.grads[first],
                      ref.grads[first]);
                free(r.grads);
            }
            free(ref.grads);
        }
    }
    check_set_label("%s", "");
}

/* The part of the arena no mode changes, in floats, from the list of
 * buffers: encoded, lnf, d_res, d_c (N C each), d_qkv (3 N C), d_fc
 * (4 N C), lnf's mean and rstd and the losses (N each), the logits (N V). */
static size_t fixed_floats(size_t N, size_t vocab)
{
    return 4 * N * C + 3 * N * C + 4 * N * C + 3 * N + N * vocab;
}

static void test_sizes(void)
{
    /* N = B T and the vocabulary multiples of 16: no buffer is padded and
     * the count is exact. */
    enum { V16 = 80 };
    dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C,
                         .vocab_size = V16, .block_size = BLOCK};
    dt_gpt m;
    char err[256];
    if (dt_gpt_create_layout(&m, &cfg, DT_PREC_F32, err, sizeof err)) {
        CHECK(0, "layout: %s", err);
        return;
    }
    const int shapes[][2] = {{2, 16}, {4, 32}, {1, 16}};
    for (size_t s = 0; s < 3; s++) {
        const int B = shapes[s][0], T = shapes[s][1];
        const size_t N = (size_t)B * T;
        size_t kept[3], shared[3];
        for (size_t k = 0; k < 3; k++) {
            m.acts.recompute = modes[k];
            kept[k] = dt_gpt_layer_act_bytes(modes[k], B, T, C, NH, &shared[k]);
            size_t carved = dt_gpt_acts_floats(&m, B, T) * sizeof(float);
            size_t fixed = fixed_floats(N, V16) * sizeof(float);
            CHECK(carved == L * kept[k] + shared[k] + fixed,
                  "%s %dx%d: carved %zu bytes, the count says %d x %zu + %zu + %zu = %zu",
                  dt_recompute_name(modes[k]), B, T, carved, L, kept[k], shared[k], fixed,
                  L * kept[k] + shared[k] + fixed);
            /* The blocks' own lists (the run's report) come to the same. */
            size_t own_shared, own = dt_gpt_layer_acts_bytes(&m, B, T, &own_shared);
            CHECK(own == kept[k] && own_shared == shared[k], "%s %dx%d: the blocks' lists say "
                  "%zu + %zu, the count %zu + %zu", dt_recompute_name(modes[k]), B, T, own,
                  own_shared, kept[k], shared[k]);
        }
        /* The per-layer figures by hand for this shape, 4 bytes a float. */
        const size_t NC = N * C;
        CHECK(kept[0] == 4 * (16 * NC + 4 * N + NH * N), "none: %zu", kept[0]);
        CHECK(kept[1] == 4 * (10 * NC + NH * N), "selective: %zu", kept[1]);
        CHECK(kept[2] == 4 * NC, "full: %zu", kept[2]);
        CHECK(shared[0] == 0 && shared[1] == 4 * (6 * NC + 4 * N) &&
                  shared[2] == 4 * (15 * NC + 4 * N + NH * N),
              "shared: %zu %zu %zu", shared[0], shared[1], shared[2]);
        /* What a mode saves over none: a layer's worth rebuilt is all a
         * layer holds but what it keeps. */
        CHECK(kept[1] + shared[1] == kept[0] && kept[2] + shared[2] == kept[0],
              "kept + shared should be none's layer");
    }
    dt_gpt_destroy(&m);
}

/* One layer more adds exactly the kept bytes (at any padding). */
static void test_per_layer_step(void)
{
    for (size_t k = 0; k < 3; k++) {
        size_t carved[2];
        for (int extra = 0; extra < 2; extra++) {
            dt_gpt_config cfg = {.n_layer = L + extra, .n_head = NH, .n_embd = C,
                                 .vocab_size = V, .block_size = BLOCK};
            dt_gpt m;
            char err[256];
            if (dt_gpt_create_layout(&m, &cfg, DT_PREC_F32, err, sizeof err)) return;
            m.acts.recompute = modes[k];
            carved[extra] = dt_gpt_acts_floats(&m, 2, 16) * sizeof(float);
            dt_gpt_destroy(&m);
        }
        size_t kept = dt_gpt_layer_act_bytes(modes[k], 2, 16, C, NH, NULL);
        CHECK(carved[1] - carved[0] == kept, "%s: a layer adds %zu bytes to the arena, the "
              "formula says %zu", dt_recompute_name(modes[k]), carved[1] - carved[0], kept);
    }
}

static void test_names_and_realloc(void)
{
    dt_recompute mode = DT_RECOMPUTE_FULL;
    for (size_t k = 0; k < 3; k++)
        CHECK(dt_recompute_parse(dt_recompute_name(modes[k]), &mode) == 0 && mode == modes[k],
              "round trip of %s", dt_recompute_name(modes[k]));
    CHECK(dt_recompute_parse("partial", &mode) == -1, "'partial' accepted");
    CHECK(dt_recompute_parse("", &mode) == -1, "'' accepted");

    dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C,
                         .vocab_size = V, .block_size = BLOCK};
    dt_gpt m;
    char err[256];
    if (dt_gpt_create(&m, &cfg, DT_PREC_F32, err, sizeof err)) return;
    CHECK(dt_gpt_alloc_acts(&m, 2, 16) == 0, "alloc: %s", m.error);
    size_t none = m.acts.floats;
    m.acts.recompute = DT_RECOMPUTE_FULL;
    CHECK(dt_gpt_alloc_acts(&m, 2, 16) == 0, "realloc: %s", m.error);
    CHECK(m.acts.floats == dt_gpt_acts_floats(&m, 2, 16) && m.acts.floats < none,
          "the mode changed after allocation: arena %zu floats, full wants %zu (none %zu)",
          m.acts.floats, dt_gpt_acts_floats(&m, 2, 16), none);
    dt_gpt_destroy(&m);
}

int main(void)
{
    dt_kernels_set_threads(2);
    test_names_and_realloc();
    test_sizes();
    test_per_layer_step();
    test_bit_identical();
    return finish("test_recompute");
}
