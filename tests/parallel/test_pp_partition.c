/* Cutting the layers into pipeline stages, and measuring what to cut by:
 *  - dt_pp_cut_balanced against a brute-force enumeration of every cut
 *    (written here, apart from the library's dynamic programming): over
 *    random weights, L 1..9 layers and S 1..L stages, the heaviest stage
 *    is the least any cut achieves, and where one cut alone achieves it
 *    (by a margin) it is that cut;
 *  - the choice `--pp-partition cost` makes (every layer the measured
 *    layer cost, the embeddings on the first stage, the head on the last)
 *    for given costs, against the enumeration's unique best cut, and a
 *    few cuts written out by hand;
 *  - dt_pp_cut_uniform's counts, and both refusing more stages than layers;
 *  - dt_pp_measure_costs on small models (fp32; bf16 mixed precision with
 *    bf16 accumulation and full recompute): finite, non-negative costs, a
 *    head that a large vocabulary makes dearer than a layer, the memory
 *    accounting (current and peak) back where it was; a micro-batch
 *    longer than the block refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/alloc.h"
#include "core/str.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/partition_cost.h"

#define MAXL 12

static double rnd01(void) { return (double)(rnd_u64() >> 11) * (1.0 / 9007199254740992.0); }

/* The heaviest stage of a cut (cut[0] = 0, cut[S] = L), summing directly. */
static double heaviest(int S, const int *cut, const double *w, double first, double last)
{
    double worst = 0;
    for (int k = 0; k < S; k++) {
        double stage = (k == 0 ? first : 0) + (k == S - 1 ? last : 0);
        for (int l = cut[k]; l < cut[k + 1]; l++) stage += w[l];
        if (stage > worst) worst = stage;
    }
    return worst;
}

static int valid(int L, int S, const int *cut)
{
    if (cut[0] != 0 || cut[S] != L) return 0;
    for (int k = 0; k < S; k++)
        if (cut[k + 1] <= cut[k]) return 0;
    return 1;
}

/* Every cut of L layers into S non-empty stages: the least heaviest stage,
 * a cut achieving it (best), and how many cuts come within tol of it. */
typedef struct {
    double least;
    int best[MAXL + 1];
    int near; /* cuts within tol of least (1: the best is unique) */
} brute;

static void enumerate(int L, int S, const double *w, double first, double last, double tol,
                      brute *b)
{
    int cut[MAXL + 1];
    b->least = INFINITY;
    b->near = 0;
    /* Two rounds: the least first, then the count near it. */
    for (int round = 0; round < 2; round++) {
        /* cut[1..S-1]: strictly increasing in 1..L-1, in lexicographic order. */
        cut[0] = 0, cut[S] = L;
        for (int k = 1; k < S; k++) cut[k] = k;
        for (;;) {
            double h = heaviest(S, cut, w, first, last);
            if (round == 0 && h < b->least) b->least = h, memcpy(b->best, cut, sizeof cut);
            if (round == 1 && h <= b->least + tol) b->near++;
            int k = S - 1;
            while (k >= 1 && cut[k] == L - (S - k)) k--;
            if (k < 1) break;
            cut[k]++;
            for (int j = k + 1; j < S; j++) cut[j] = cut[j - 1] + 1;
        }
    }
}

static void random_weights(void)
{
    int unique = 0, cases = 0;
    for (int trial = 0; trial < 300; trial++) {
        int L = 1 + (int)(rnd_u64() % 9), S = 1 + (int)(rnd_u64() % (uint64_t)L);
        double w[MAXL], first = 4 * rnd01(), last = 8 * rnd01();
        for (int l = 0; l < L; l++) w[l] = 0.25 + 2 * rnd01();
        int cut[MAXL + 1];
        char err[256] = "";
        int rc = dt_pp_cut_balanced(L, S, w, first, last, cut, err, sizeof err);
        CHECK(rc == 0, "L %d S %d: %s", L, S, err);
        if (rc) continue;
        brute b;
        enumerate(L, S, w, first, last, 1e-9, &b);
        CHECK(valid(L, S, cut), "L %d S %d: an invalid cut", L, S);
        double h = heaviest(S, cut, w, first, last);
        CHECK(fabs(h - b.least) <= 1e-12 * b.least, "L %d S %d: heaviest stage %.17g, the "
              "enumeration's least %.17g", L, S, h, b.least);
        cases++;
        if (b.near != 1) continue;
        unique++;
        CHECK(!memcmp(cut, b.best, (size_t)(S + 1) * sizeof *cut),
              "L %d S %d: the DP cut differs from the unique best one", L, S);
    }
    /* The uniqueness branch must have been exercised. */
    CHECK(unique > cases / 2, "only %d of %d random cases had a unique best cut", unique, cases);
}

/* The pipeline's use for --pp-partition cost: every layer `layer`, the
 * embeddings `embed` on stage 0, the head `head` on the last. */
static void cost_cut(int L, int S, double embed, double layer, double head, int *cut)
{
    double w[MAXL];
    char err[256] = "";
    for (int l = 0; l < L; l++) w[l] = layer;
    CHECK(dt_pp_cut_balanced(L, S, w, embed, head, cut, err, sizeof err) == 0, "%s", err);
}

static void chosen_by_cost(void)
{
    static const struct {
        int L, S;
        double embed, layer, head;
        int want[5]; /* written out by hand; checked against the enumeration too */
    } cases[] = {
        /* The head as dear as three layers: the last stage gets one layer. */
        {6, 2, 0.4, 3.1, 9.8, {0, 5, 6}},
        /* A free head and embeddings: even halves. */
        {6, 2, 0, 1, 0, {0, 3, 6}},
        /* Dear embeddings: the first stage gets fewer layers. */
        {8, 2, 5.2, 1, 0.5, {0, 2, 8}},
        /* Both ends dear, 3 stages: the middle stage takes the most layers. */
        {8, 3, 2.2, 1, 2.7, {0, 2, 6, 8}},
        {12, 4, 0.3, 2, 6.1, {0, 3, 7, 11, 12}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int L = cases[i].L, S = cases[i].S, cut[MAXL + 1];
        double w[MAXL];
        for (int l = 0; l < L; l++) w[l] = cases[i].layer;
        brute b;
        enumerate(L, S, w, cases[i].embed, cases[i].head, 1e-9, &b);
        CHECK(b.near == 1 && !memcmp(b.best, cases[i].want, (size_t)(S + 1) * sizeof(int)),
              "case %zu: the hand-written cut is not the unique best one (%d near)", i, b.near);
        cost_cut(L, S, cases[i].embed, cases[i].layer, cases[i].head, cut);
        CHECK(!memcmp(cut, b.best, (size_t)(S + 1) * sizeof *cut),
              "case %zu: cut [%d,%d,%d...] differs from the enumeration's [%d,%d,%d...]", i,
              cut[0], cut[1], cut[2], b.best[0], b.best[1], b.best[2]);
    }
    /* Random costs as the pipeline forms them. */
    int unique = 0;
    for (int trial = 0; trial < 200; trial++) {
        int L = 2 + (int)(rnd_u64() % 10), S = 2 + (int)(rnd_u64() % (uint64_t)(L - 1));
        double layer = 0.1 + rnd01(), embed = 3 * rnd01(), head = 10 * rnd01(), w[MAXL];
        for (int l = 0; l < L; l++) w[l] = layer;
        int cut[MAXL + 1];
        brute b;
        enumerate(L, S, w, embed, head, 1e-9, &b);
        cost_cut(L, S, embed, layer, head, cut);
        CHECK(fabs(heaviest(S, cut, w, embed, head) - b.least) <= 1e-12 * b.least,
              "cost L %d S %d: not the least heaviest stage", L, S);
        if (b.near != 1) continue;
        unique++;
        CHECK(!memcmp(cut, b.best, (size_t)(S + 1) * sizeof *cut),
              "cost L %d S %d (embed %g layer %g head %g): not the unique best cut", L, S, embed,
              layer, head);
    }
    CHECK(unique > 20, "only %d random cost cases had a unique best cut", unique);
}

static void uniform_and_refusals(void)
{
    int cut[MAXL + 1];
    char err[256] = "";
    CHECK(dt_pp_cut_uniform(10, 4, cut, err, sizeof err) == 0, "%s", err);
    const int want[] = {0, 3, 6, 8, 10};
    CHECK(!memcmp(cut, want, sizeof want), "uniform 10 / 4: [%d,%d,%d,%d,%d]", cut[0], cut[1],
          cut[2], cut[3], cut[4]);
    double w[3] = {1, 1, 1};
    int rc = dt_pp_cut_balanced(3, 4, w, 0, 0, cut, err, sizeof err);
    CHECK_ERR(rc, err, "4 pipeline stages need at least 4 layers");
    rc = dt_pp_cut_uniform(3, 4, cut, err, sizeof err);
    CHECK_ERR(rc, err, "the model has 3");
    dt_pp_part_kind kind;
    CHECK(dt_pp_part_parse("cost", &kind) == 0 && kind == DT_PP_PART_COST, "parse cost");
    CHECK(dt_pp_part_parse("time", &kind) != 0, "parse refuses 'time'");
}

/* ---- the measurement --------------------------------------------------- */

static const dt_mem_kind kinds[] = {DT_MEM_PARAMS, DT_MEM_GRADS, DT_MEM_OPTIM, DT_MEM_ACTS};
#define NKINDS (sizeof kinds / sizeof kinds[0])

static void snapshot(size_t *cur, size_t *peak)
{
    for (size_t i = 0; i < NKINDS; i++)
        cur[i] = dt_mem_current(kinds[i]), peak[i] = dt_mem_peak(kinds[i]);
}

static int measure_like(const dt_gpt_config *cfg, int bf16, dt_recompute rec, int B, int T,
                        dt_pp_costs *c, char *err, size_t n)
{
    dt_gpt like;
    if (dt_gpt_create_layout(&like, cfg, bf16 ? DT_PREC_BF16 : DT_PREC_F32, err, n)) return -1;
    like.acts.recompute = rec;
    int rc = bf16 && (dt_gpt_set_mixed(&like) || dt_gpt_set_grads16(&like));
    if (rc) dt_strf(err, n, "%s", like.error);
    if (!rc) rc = dt_pp_measure_costs(&like, B, T, c, err, n);
    dt_gpt_destroy(&like);
    return rc ? -1 : 0;
}

/* The head, at a large vocabulary, costs more than a layer and the
 * embeddings. */
static void check_cost_order(const dt_gpt_config *cfg, int bf16, dt_recompute rec,
                             dt_pp_costs *c)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* Instrumented loops (layer norms, attention, the bf16 rounding) slow
     * down several times and oneDNN's products not at all, so the costs'
     * order is not the model's: the main build checks it. */
    (void)cfg, (void)bf16, (void)rec, (void)c;
    printf("%sthe costs' order is checked by the uninstrumented build\n", check_label);
#else
    char err[512] = "";
    /* Timing on shared cores is noisy: the order must show in one of up to
     * 3 measurements (one that misplaces the pieces fails all of them). */
    int ordered = 0;
    for (int attempt = 0; attempt < 3 && !ordered; attempt++) {
        if (attempt && measure_like(cfg, bf16, rec, 2, 32, c, err, sizeof err)) break;
        ordered = c->head_ms > c->layer_ms && c->head_ms > c->embed_ms;
        if (!ordered)
            printf("%sthe head %.4f ms, a layer %.4f ms, the embeddings %.4f ms: measured "
                   "again\n", check_label, c->head_ms, c->layer_ms, c->embed_ms);
    }
    CHECK(ordered, "the head (vocabulary 8192) costs %g ms, not more than a layer (%g) and "
          "the embeddings (%g), in 3 measurements%s%s", c->head_ms, c->layer_ms, c->embed_ms,
          err[0] ? ": " : "", err);
#endif
}

static void measurement(int bf16, dt_recompute rec)
{
    check_set_label("%s, recompute %s: ", bf16 ? "bf16 mixed" : "fp32", dt_recompute_name(rec));
    /* A large vocabulary: the head's products are ~10x a layer's. */
    dt_gpt_config cfg = {.n_layer = 6, .n_head = 2, .n_embd = 64, .vocab_size = 8192,
                         .block_size = 32};
    dt_pp_costs c;
    char err[512] = "";
    size_t cur0[NKINDS], peak0[NKINDS], cur1[NKINDS], peak1[NKINDS];
    snapshot(cur0, peak0);
    int rc = measure_like(&cfg, bf16, rec, 2, 32, &c, err, sizeof err);
    CHECK(rc == 0, "measuring: %s", err);
    if (rc) return;
    snapshot(cur1, peak1);
    /* Parameters, gradients and optimizer state: exactly as before; the
     * activations may keep the matmul workspace of this thread. */
    for (size_t i = 0; i < 3; i++)
        CHECK(cur1[i] == cur0[i] && peak1[i] == peak0[i],
              "%s: held %zu -> %zu, peak %zu -> %zu", dt_mem_kind_name(kinds[i]), cur0[i],
              cur1[i], peak0[i], peak1[i]);
    CHECK(peak1[3] == (peak0[3] > cur1[3] ? peak0[3] : cur1[3]),
          "acts: peak %zu -> %zu, held now %zu", peak0[3], peak1[3], cur1[3]);
    printf("%s%s: embed %.4f ms, layer %.4f ms, head %.4f ms\n", check_label, "costs",
           c.embed_ms, c.layer_ms, c.head_ms);
    CHECK(isfinite(c.embed_ms) && isfinite(c.layer_ms) && isfinite(c.head_ms) &&
          c.embed_ms >= 0 && c.layer_ms > 0 && c.head_ms >= 0,
          "costs embed %g layer %g head %g", c.embed_ms, c.layer_ms, c.head_ms);
    check_cost_order(&cfg, bf16, rec, &c);
    /* Once the workspace exists, everything is back exactly. */
    snapshot(cur0, peak0);
    rc = measure_like(&cfg, bf16, rec, 2, 32, &c, err, sizeof err);
    snapshot(cur1, peak1);
    CHECK(rc == 0 && !memcmp(cur0, cur1, sizeof cur0) && !memcmp(peak0, peak1, sizeof peak0),
          "a second measurement leaves the accounting as it found it (%s)", err);
    /* A micro-batch longer than the block. */
    snapshot(cur0, peak0);
    rc = measure_like(&cfg, bf16, rec, 2, 64, &c, err, sizeof err);
    CHECK_ERR(rc, err, "does not fit");
    snapshot(cur1, peak1);
    CHECK(!memcmp(cur0, cur1, sizeof cur0) && !memcmp(peak0, peak1, sizeof peak0),
          "a refused measurement leaves the accounting as it found it");
    check_set_label("%s", "");
}

int main(void)
{
    random_weights();
    chosen_by_cost();
    uniform_and_refusals();
    measurement(0, DT_RECOMPUTE_NONE);
    measurement(1, DT_RECOMPUTE_FULL);
    return finish("test_pp_partition");
}
