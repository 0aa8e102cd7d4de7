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
 * without. Sequence parallelism (3 sequences of 8: 24 rows, split over
 * 2, 3 and 4 ranks): the regions' activations (embeddings' output, res2,
 * res3) are this rank's rows of the unsplit model's, the losses and every
 * gradient as above, and the arena holds (1 - 1/N) of the regions' floats
 * less (the residual stream's three [rows, C] a layer and the LayerNorm
 * statistics) than tensor parallelism alone, less its gather buffer. And
 * refusals: heads that do not split, a vocabulary that leaves a rank no
 * rows, rows that do not split. Run under `dtrain launch -n N` (N = 2, 3,
 * 4). */
#include "dtrain/comm.h"
#include "kernels/kernel_test.h"
#include "kernels/threads.h"
#include "model/gpt.h"
#include "parallel/tensor/tp.h"
#include "rank_test.h"

enum { B = 2, T = 7, SP_B = 3, SP_T = 8 };
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

/* One run's shape: b sequences of t, sequence parallelism or not. */
typedef struct {
    int b, t, sp;
    dt_recompute rc;
} shape;

static void build(dt_gpt *m, int rank, int size, dt_comm *comm, shape s)
{
    char err[256];
    CHECK(dt_gpt_create_layout(m, &CFG, DT_PREC_F32, err, sizeof err) == 0, "layout: %s", err);
    CHECK(dt_gpt_set_tp(m, rank, size) == 0, "set_tp: %s", m->error);
    m->tp.sp = s.sp && size > 1;
    m->tp.reduce = dt_tp_reduce;
    m->tp.ctx = comm;
    m->acts.recompute = s.rc;
    CHECK(dt_gpt_alloc_params(m) == 0 && dt_gpt_alloc_grads(m) == 0 &&
              dt_gpt_alloc_acts(m, s.b, s.t) == 0,
          "buffers: %s", m->error);
    dt_gpt_init_weights(m, 7);
    dt_gpt_zero_grads(m);
}

/* Forward and backward of both; the activations compared on the way. */
/* Forward and backward of both; the activations compared on the way
 * (the regions' with sequence parallelism: this rank's rows of them). */
static void run(dt_gpt *part, dt_gpt *whole, const int32_t *tok, const int32_t *tgt, shape s)
{
    const size_t N = (size_t)s.b * s.t, C = (size_t)CFG.n_embd;
    const size_t R = s.sp ? N / (size_t)part->tp.size : N, r0 = s.sp ? part->tp.rank * R : 0;
    double lp = dt_gpt_forward(part, tok, tgt, s.b, s.t);
    double lw = dt_gpt_forward(whole, tok, tgt, s.b, s.t);
    CHECK(lp >= 0 && fabs(lp - lw) <= 1e-6 * lw, "loss %.9g, unsplit %.9g (%s)", lp, lw,
          part->error);
    compare(part->acts.encoded, whole->acts.encoded + r0 * C, R * C, "embeddings' output");
    for (int l = 0; l < CFG.n_layer; l++) {
        char what[64];
        snprintf(what, sizeof what, "layer %d attention output (res2)", l);
        /* Full recomputation keeps res3 alone: res2 is the last layer's. */
        if (part->acts.recompute == DT_RECOMPUTE_NONE)
            compare(dt_gpt_residual(part, l, 1), dt_gpt_residual(whole, l, 1) + r0 * C, R * C, what);
        snprintf(what, sizeof what, "layer %d MLP output (res3)", l);
        compare(dt_gpt_residual(part, l, 3), dt_gpt_residual(whole, l, 3) + r0 * C, R * C, what);
    }
    compare(part->acts.losses, whole->acts.losses, N, "per-token losses");
    CHECK(dt_gpt_backward(part, tok, s.b, s.t, 1.0f / (float)N) == 0, "backward: %s",
          part->error);
    CHECK(dt_gpt_backward(whole, tok, s.b, s.t, 1.0f / (float)N) == 0, "backward: %s",
          whole->error);
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

static void run_case(dt_comm *comm, int rank, int size, shape s, float *grads_out)
{
    dt_gpt part, whole;
    build(&part, rank, size, comm, s);
    build(&whole, 0, 1, NULL, (shape){s.b, s.t, 0, DT_RECOMPUTE_NONE});
    int n = dt_gpt_tp_ranges(&part, &whole, NULL, 0);
    dt_flat_range *map = malloc((size_t)n * sizeof *map);
    CHECK(dt_gpt_tp_ranges(&part, &whole, map, n) == n, "ranges counted twice alike");
    float *p0 = gather_mine(&part, whole.params, map, n);
    for (int i = 0; i < part.n_tensors; i++) {
        const dt_param_tensor *t = &part.tensors[i];
        CHECK(bits_equal(part.params + t->offset, p0 + t->offset, t->numel),
              "initial %s: the whole model's values at the slice's ranges", t->name);
    }
    int32_t tok[SP_B * SP_T], tgt[SP_B * SP_T];
    for (int i = 0; i < s.b * s.t; i++) tok[i] = (i * 7 + 3) % CFG.vocab_size;
    for (int i = 0; i < s.b * s.t; i++) tgt[i] = (i * 5 + 1) % CFG.vocab_size;
    run(&part, &whole, tok, tgt, s);
    float *g = gather_mine(&part, whole.grads, map, n);
    compare_tensors(&part, part.grads, g, "gradient");
    if (grads_out) memcpy(grads_out, part.grads, part.n_floats * sizeof(float));
    else if (s.rc != DT_RECOMPUTE_NONE) CHECK(0, "a recompute run needs the reference gradients");
    free(g), free(p0), free(map);
    dt_gpt_destroy(&part);
    dt_gpt_destroy(&whole);
}

/* Floats of the arena's buffer of n, as carved (64-byte aligned). */
static size_t al(size_t n) { return (n + 15) / 16 * 16; }

/* The arena under sequence parallelism against tensor parallelism alone:
 * per layer res2, res3 and the LayerNorms' four statistics, and the
 * embeddings' output and ln_f's two statistics, at R rows of N; plus the
 * gathered [N, C] and a LayerNorm's own weight gradients, [2C]. */
static void sp_memory(int rank, int size)
{
    dt_gpt a, b;
    char err[256];
    const size_t N = (size_t)SP_B * SP_T, R = N / (size_t)size, C = (size_t)CFG.n_embd;
    dt_gpt_create_layout(&a, &CFG, DT_PREC_F32, err, sizeof err);
    dt_gpt_create_layout(&b, &CFG, DT_PREC_F32, err, sizeof err);
    dt_gpt_set_tp(&a, rank, size);
    dt_gpt_set_tp(&b, rank, size);
    b.tp.sp = 1;
    size_t tp = dt_gpt_acts_floats(&a, SP_B, SP_T), sp = dt_gpt_acts_floats(&b, SP_B, SP_T);
    size_t regions_tp = (size_t)CFG.n_layer * (2 * al(N * C) + 4 * al(N)) + al(N * C) +
                        2 * al(N);
    size_t regions_sp = (size_t)CFG.n_layer * (2 * al(R * C) + 4 * al(R)) + al(R * C) +
                        2 * al(R);
    CHECK(tp - sp == regions_tp - regions_sp - al(N * C) - al(2 * C),
          "sequence parallelism: the arena holds %zu floats less (%zu against %zu), the "
          "regions' %zu at 1/%d (%zu), less the gather buffers", tp - sp, sp, tp, regions_tp,
          size, regions_sp);
    dt_gpt_destroy(&a);
    dt_gpt_destroy(&b);
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
    CHECK(dt_gpt_create_layout(&m, &c, DT_PREC_F32, err, sizeof err) == 0 &&
              dt_gpt_set_tp(&m, 0, 4) == 0, "layout");
    m.tp.sp = 1;
    CHECK(dt_gpt_alloc_acts(&m, 1, 7) != 0 && strstr(m.error, "7 rows") &&
              strstr(m.error, "multiple of 4"),
          "sequence parallelism over 4 ranks refuses 7 rows, naming them: %s", m.error);
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
    int rank, N;
    dt_comm *comm = rank_test_start(&rank, &N);
    if (!comm) return 1;
    dt_gpt probe;
    char err[256];
    dt_gpt_create_layout(&probe, &CFG, DT_PREC_F32, err, sizeof err);
    dt_gpt_set_tp(&probe, rank, N);
    float *none = malloc(probe.n_floats * sizeof *none), *full = malloc(probe.n_floats * sizeof *full);
    run_case(comm, rank, N, (shape){B, T, 0, DT_RECOMPUTE_NONE}, none);
    run_case(comm, rank, N, (shape){B, T, 0, DT_RECOMPUTE_FULL}, full);
    CHECK(bits_equal(none, full, probe.n_floats), "full recomputation: the gradients' bits");
    run_case(comm, rank, N, (shape){SP_B, SP_T, 1, DT_RECOMPUTE_NONE}, none);
    run_case(comm, rank, N, (shape){SP_B, SP_T, 1, DT_RECOMPUTE_SELECTIVE}, full);
    CHECK(bits_equal(none, full, probe.n_floats),
          "sequence parallelism, selective recomputation (its LayerNorms gather again): the "
          "gradients' bits");
    sp_memory(rank, N);
    printf("rank %d of %d: worst relative error (activations, losses, gradients) %.3g\n", rank, N,
           worst);
    refusals();
    free(none), free(full);
    dt_gpt_destroy(&probe);
    dt_comm_destroy(comm);
    return finish("test_tp_layers");
}
