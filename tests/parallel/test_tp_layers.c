/* Tensor parallelism layer by layer against the unsplit model in one
 * process, fp32: every rank builds the whole model and its own slice of
 * it from the same seed, runs both on the same tokens, and compares
 *   - the initial parameters: the slice's are the whole model's values at
 *     the ranges dt_gpt_tp_ranges names, bit for bit;
 *   - forward: the embeddings' output (vocabulary-parallel lookup), each
 *     layer's attention block output (res2: column-parallel c_attn, the
 *     rank's heads, row-parallel c_proj, reduced) and MLP block output
 *     (res3), the per-token losses (vocabulary-parallel cross-entropy);
 *   - backward: every tensor's gradient, the slices' at their ranges;
 * within 1e-5 relative. Odd sizes: 12 heads of 5, a vocabulary of 23
 * (unequal slices at 2, 3 and 4 ranks), 7 positions. Also with full
 * recomputation (its rebuilt layers reduce again): the same bits as
 * without. And refusals: heads that do not split, a vocabulary that
 * leaves a rank no rows. Run under `dtrain launch -n N` (N = 2, 3, 4). */
#include "dtrain/comm.h"
#include "kernels/kernel_test.h"
#include "kernels/threads.h"
#include "model/gpt.h"
#include "parallel/tensor/tp.h"

enum { B = 2, T = 7 };
static const dt_gpt_config CFG = {.n_layer = 2, .n_head = 12, .n_embd = 60, .vocab_size = 23,
                                  .block_size = 9};

static double worst;

/* got [n] against want [n] (the whole model's floats, in double). */
static void compare(const float *got, const float *want, size_t n, const char *what)
{
    double *w = dalloc(n);
    for (size_t i = 0; i < n; i++) w[i] = want[i];
    double e = rel_error(got, w, n);
    if (e > worst) worst = e;
    CHECK_CLOSE(got, w, n, 1e-5, "%s", what);
    free(w);
}

/* The whole buffer's values at this rank's ranges, laid out as its own. */
static float *gather_mine(const dt_gpt *part, const float *whole, const dt_flat_range *map,
                          int n)
{
    float *x = calloc(part->n_floats, sizeof *x);
    for (int i = 0; i < n; i++)
        memcpy(x + map[i].at, whole + map[i].lo, (map[i].hi - map[i].lo) * sizeof *x);
    return x;
}

static void build(dt_gpt *m, int rank, int size, dt_comm *comm, dt_recompute rc)
{
    char err[256];
    CHECK(dt_gpt_create_layout(m, &CFG, DT_PREC_F32, err, sizeof err) == 0, "layout: %s", err);
    CHECK(dt_gpt_set_tp(m, rank, size) == 0, "set_tp: %s", m->error);
    m->tp.reduce = dt_tp_reduce;
    m->tp.ctx = comm;
    m->recompute = rc;
    CHECK(dt_gpt_alloc_params(m) == 0 && dt_gpt_alloc_grads(m) == 0 &&
              dt_gpt_alloc_acts(m, B, T) == 0,
          "buffers: %s", m->error);
    dt_gpt_init_weights(m, 7);
    dt_gpt_zero_grads(m);
}

/* Forward and backward of both; the activations compared on the way. */
static void run(dt_gpt *part, dt_gpt *whole, const int32_t *tok, const int32_t *tgt)
{
    const size_t N = (size_t)B * T, C = (size_t)CFG.n_embd;
    double lp = dt_gpt_forward(part, tok, tgt, B, T), lw = dt_gpt_forward(whole, tok, tgt, B, T);
    CHECK(lp >= 0 && fabs(lp - lw) <= 1e-6 * lw, "loss %.9g, unsplit %.9g (%s)", lp, lw,
          part->error);
    compare(part->encoded, whole->encoded, N * C, "embeddings' output");
    for (int l = 0; l < CFG.n_layer; l++) {
        char what[64];
        snprintf(what, sizeof what, "layer %d attention output (res2)", l);
        /* Full recomputation keeps res3 alone: res2 is the last layer's. */
        if (part->recompute == DT_RECOMPUTE_NONE)
            compare(part->layer_acts[l].res2, whole->layer_acts[l].res2, N * C, what);
        snprintf(what, sizeof what, "layer %d MLP output (res3)", l);
        compare(part->layer_acts[l].res3, whole->layer_acts[l].res3, N * C, what);
    }
    compare(part->losses, whole->losses, N, "per-token losses");
    CHECK(dt_gpt_backward(part, tok, B, T, 1.0f / (float)N) == 0, "backward: %s", part->error);
    CHECK(dt_gpt_backward(whole, tok, B, T, 1.0f / (float)N) == 0, "backward: %s", whole->error);
}

/* Every tensor of the slice against the whole model's at its ranges. */
static void compare_tensors(const dt_gpt *part, const float *mine, const float *want,
                            const char *kind)
{
    for (int i = 0; i < part->n_tensors; i++) {
        const dt_param_tensor *t = &part->tensors[i];
        char what[96];
        snprintf(what, sizeof what, "%s of %s", kind, t->name);
        compare(mine + t->offset, want + t->offset, t->numel, what);
    }
}

static void run_case(dt_comm *comm, int rank, int size, dt_recompute rc, float *grads_out)
{
    dt_gpt part, whole;
    build(&part, rank, size, comm, rc);
    build(&whole, 0, 1, NULL, DT_RECOMPUTE_NONE);
    int n = dt_gpt_tp_ranges(&part, &whole, NULL, 0);
    dt_flat_range *map = malloc((size_t)n * sizeof *map);
    CHECK(dt_gpt_tp_ranges(&part, &whole, map, n) == n, "ranges counted twice alike");
    float *p0 = gather_mine(&part, whole.params, map, n);
    for (int i = 0; i < part.n_tensors; i++) {
        const dt_param_tensor *t = &part.tensors[i];
        CHECK(bits_equal(part.params + t->offset, p0 + t->offset, t->numel),
              "initial %s: the whole model's values at the slice's ranges", t->name);
    }
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 7 + 3) % CFG.vocab_size;
    for (int i = 0; i < B * T; i++) tgt[i] = (i * 5 + 1) % CFG.vocab_size;
    run(&part, &whole, tok, tgt);
    float *g = gather_mine(&part, whole.grads, map, n);
    compare_tensors(&part, part.grads, g, "gradient");
    if (grads_out) memcpy(grads_out, part.grads, part.n_floats * sizeof(float));
    else if (rc != DT_RECOMPUTE_NONE) CHECK(0, "a recompute run needs the reference gradients");
    free(g), free(p0), free(map);
    dt_gpt_destroy(&part);
    dt_gpt_destroy(&whole);
}

static void refusals(void)
{
    dt_gpt m;
    char err[256];
    dt_gpt_config c = CFG;
    CHECK(dt_gpt_create_layout(&m, &c, DT_PREC_F32, err, sizeof err) == 0, "layout");
    CHECK(dt_gpt_set_tp(&m, 0, 5) != 0 && strstr(m.error, "12 heads") &&
              strstr(m.error, "1, 2, 3, 4, 6 or 12"),
          "--tp 5 with 12 heads refused naming the heads and what works: %s", m.error);
    dt_gpt_destroy(&m);
    c.vocab_size = 9;
    CHECK(dt_gpt_create_layout(&m, &c, DT_PREC_F32, err, sizeof err) == 0, "layout");
    CHECK(dt_gpt_set_tp(&m, 0, 4) != 0 && strstr(m.error, "vocabulary of 9") &&
              strstr(m.error, "rank 3 none"),
          "a vocabulary of 9 over 4 ranks refused (rank 3 would hold no rows): %s", m.error);
    dt_gpt_destroy(&m);
}

int main(void)
{
    dt_comm *comm;
    if (dt_comm_init(&comm)) {
        fprintf(stderr, "comm init: %s\n", dt_last_error());
        return 1;
    }
    int rank = dt_comm_rank(comm), N = dt_comm_size(comm);
    dt_kernels_set_threads(1);
    check_set_label("rank %d of %d: ", rank, N);
    dt_gpt probe;
    char err[256];
    dt_gpt_create_layout(&probe, &CFG, DT_PREC_F32, err, sizeof err);
    dt_gpt_set_tp(&probe, rank, N);
    float *none = malloc(probe.n_floats * sizeof *none), *full = malloc(probe.n_floats * sizeof *full);
    run_case(comm, rank, N, DT_RECOMPUTE_NONE, none);
    run_case(comm, rank, N, DT_RECOMPUTE_FULL, full);
    CHECK(bits_equal(none, full, probe.n_floats), "full recomputation: the gradients' bits");
    printf("rank %d of %d: worst relative error (activations, losses, gradients) %.3g\n", rank, N,
           worst);
    refusals();
    free(none), free(full);
    dt_gpt_destroy(&probe);
    dt_comm_destroy(comm);
    return finish("test_tp_layers");
}
