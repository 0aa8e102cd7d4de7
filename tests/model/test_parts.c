/* The model cut into parts, as pipeline stages run it, in one process:
 * micro-batches forward through every part (each in its own activation
 * slot, several in flight at once), then backward from the last part to
 * the first, each part handing its input's gradient to the part before.
 * The losses and every gradient must be the bits of the whole model run
 * one micro-batch at a time: the same kernels on the same inputs, and the
 * gradients accumulated in the same order, micro-batch by micro-batch
 * (but wte's with a tied copy: within a rounding). Checked for cuts into 2
 * and 3 parts, with 3 micro-batches in flight, in every recompute mode,
 * and that each segment reports grad_ready once per backward; and the same
 * with every backward split in its input and weight halves, the weights'
 * run a micro-batch late, which must not change a bit either. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model/gpt.h"

enum { L = 4, NH = 2, C = 32, V = 67, BLOCK = 16, B = 2, T = 16, M = 3 };

static int ready[L + 2];

static void on_ready(void *ctx, size_t lo, size_t hi)
{
    dt_gpt *m = ctx;
    for (int s = 0; s < dt_gpt_segments(m); s++)
        if (dt_gpt_segment_start(m, s) == lo && dt_gpt_segment_start(m, s + 1) == hi) ready[s]++;
}

static int make(dt_gpt *m, dt_recompute mode)
{
    dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C,
                         .vocab_size = V, .block_size = BLOCK};
    char err[256] = "";
    m->acts.recompute = DT_RECOMPUTE_NONE;
    if (dt_gpt_create(m, &cfg, DT_PREC_F32, err, sizeof err) || dt_gpt_alloc_grads(m)) {
        CHECK(0, "model: %s %s", err, m->error);
        return -1;
    }
    m->acts.recompute = mode;
    dt_gpt_init_weights(m, 5);
    return 0;
}

/* The reference: the whole model, one micro-batch at a time. */
static int run_whole(dt_gpt *m, const int32_t *tok, double *loss)
{
    if (dt_gpt_alloc_acts(m, B, T)) { CHECK(0, "%s", m->error); return -1; }
    for (int i = 0; i < M; i++) {
        const int32_t *x = tok + (size_t)i * 2 * B * T;
        loss[i] = dt_gpt_forward(m, x, x + B * T, B, T);
        if (loss[i] < 0 || dt_gpt_backward(m, x, B, T, 1.0f / (M * B * T)))
            { CHECK(0, "whole: %s", m->error); return -1; }
    }
    return 0;
}

/* The weight halves of micro-batch i's split backward, every part, and
 * each segment reported once (segment 0 twice with a tied copy). */
static int run_weights(dt_gpt *m, int i, int nparts)
{
    memset(ready, 0, sizeof ready);
    for (int j = nparts - 1; j >= 0; j--)
        if (dt_gpt_backward_part(m, j * M + i, NULL, 0, DT_BWD_WEIGHTS))
            { CHECK(0, "weights of part %d: %s", j, m->error); return -1; }
    for (int s = 0; s < L + 2; s++)
        CHECK(ready[s] == (s == 0 && nparts > 1 ? 2 : 1),
              "segment %d reported %d times in micro-batch %d's weight halves", s, ready[s], i);
    return 0;
}

/* Parts [cut[j], cut[j+1]); slot j * M + i holds micro-batch i of part j.
 * split: each backward in two halves, the weights' one micro-batch late
 * (so micro-batch i's input halves run between i - 1's two halves), as a
 * zero-bubble schedule runs them. */
static int run_parts(dt_gpt *m, const int32_t *tok, const int *cut, int nparts, int split,
                     double *loss)
{
    dt_gpt_part parts[3 * M];
    for (int j = 0; j < nparts; j++)
        for (int i = 0; i < M; i++) parts[j * M + i] = (dt_gpt_part){cut[j], cut[j + 1]};
    m->acts.split_backward = split;
    if (dt_gpt_alloc_slots(m, B, T, nparts * M, parts)) { CHECK(0, "%s", m->error); return -1; }
    m->hooks.grad_ready = on_ready;
    m->hooks.grad_ctx = m;
    for (int i = 0; i < M; i++) { /* every forward first: M micro-batches in flight */
        const int32_t *x = tok + (size_t)i * 2 * B * T;
        for (int j = 0; j < nparts; j++) {
            int k = j * M + i;
            if (j > 0)
                memcpy(dt_gpt_slot_input(m, k), dt_gpt_slot_output(m, k - M),
                       sizeof(float) * B * T * C);
            double l = dt_gpt_forward_slot(m, k, x, j == nparts - 1 ? x + B * T : NULL, B, T);
            if (l < 0) { CHECK(0, "forward part %d: %s", j, m->error); return -1; }
            if (j == nparts - 1) loss[i] = l;
        }
    }
    float *d = malloc(sizeof(float) * B * T * C);
    for (int i = 0; i < M; i++) {
        memset(ready, 0, sizeof ready);
        for (int j = nparts - 1; j >= 0; j--) {
            int k = j * M + i;
            if (dt_gpt_backward_part(m, k, j == nparts - 1 ? NULL : d, 1.0f / (M * B * T),
                                     split ? DT_BWD_INPUT : DT_BWD_WHOLE))
            { free(d); CHECK(0, "backward part %d: %s", j, m->error); return -1; }
            if (j > 0) memcpy(d, dt_gpt_slot_input_grad(m, k), sizeof(float) * B * T * C);
        }
        if (split) {
            for (int s = 0; s < L + 2; s++)
                CHECK(ready[s] == 0, "segment %d reported by an input half", s);
            if (i > 0 && run_weights(m, i - 1, nparts)) { free(d); return -1; }
            continue;
        }
        /* Segment 0 twice: once for the head's tied copy, once after the embeddings. */
        for (int s = 0; s < L + 2; s++)
            CHECK(ready[s] == (s == 0 && nparts > 1 ? 2 : 1),
                  "segment %d reported %d times in micro-batch %d", s, ready[s], i);
    }
    free(d);
    if (split && run_weights(m, M - 1, nparts)) return -1;
    m->hooks.grad_ready = NULL;
    return 0;
}

static void compare(dt_recompute mode, const int *cut, int nparts, int split)
{
    check_set_label("%s, %d parts%s: ", dt_recompute_name(mode), nparts,
                    split ? ", split backward" : "");
    dt_gpt whole, cutm;
    int32_t tok[M * 2 * B * T];
    rng_state = 31;
    for (size_t i = 0; i < sizeof tok / sizeof tok[0]; i++) tok[i] = (int32_t)(rnd_u64() % V);
    double lw[M], lp[M];
    if (make(&whole, mode) || make(&cutm, mode) || run_whole(&whole, tok, lw) ||
        run_parts(&cutm, tok, cut, nparts, split, lp))
        goto out;
    for (int i = 0; i < M; i++)
        CHECK(lw[i] == lp[i], "micro-batch %d loss %.17g, whole %.17g", i, lp[i], lw[i]);
    /* With the head apart from the embeddings, wte's two terms of a
     * micro-batch are added into the sum one after the other, as a
     * pipeline's two tied copies are; the whole model forms the
     * micro-batch's gradient first and adds it once (model/gpt.h): the
     * same sums in another order, so wte holds a rounding's distance. */
    const size_t wte = nparts > 1 ? (size_t)V * C : 0;
    size_t diff = 0, first = 0;
    for (size_t i = wte; i < whole.n_floats; i++)
        if (memcmp(&whole.grads[i], &cutm.grads[i], sizeof(float)) && diff++ == 0) first = i;
    CHECK(diff == 0, "%zu gradients differ from the whole model's, first at float %zu", diff,
          first);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < wte; i++) {
        double e = fabs((double)whole.grads[i] - cutm.grads[i]);
        worst = e > worst ? e : worst;
        scale = fabs(whole.grads[i]) > scale ? fabs(whole.grads[i]) : scale;
    }
    CHECK(worst <= 1e-6 * scale, "wte's gradient %.3g from the whole model's (largest %.3g)",
          worst, scale);
out:
    dt_gpt_destroy(&whole);
    dt_gpt_destroy(&cutm);
}

int main(void)
{
    const int two[] = {0, 1, L}, three[] = {0, 2, 3, L};
    for (int mode = DT_RECOMPUTE_NONE; mode <= DT_RECOMPUTE_FULL; mode++) {
        for (int split = 0; split <= 1; split++) {
            compare((dt_recompute)mode, two, 2, split);
            compare((dt_recompute)mode, three, 3, split);
        }
    }
    /* A whole model, split: its embeddings' gradient waits for the weights. */
    const int one[] = {0, L};
    compare(DT_RECOMPUTE_NONE, one, 1, 1);
    /* A part must hold a layer, inside the model. */
    dt_gpt m;
    if (make(&m, DT_RECOMPUTE_NONE) == 0) {
        dt_gpt_part bad[] = {{0, 0}, {2, 5}};
        check_set_label("refusals: ");
        CHECK(dt_gpt_alloc_slots(&m, B, T, 1, &bad[0]) == -1, "an empty part was accepted");
        CHECK(dt_gpt_alloc_slots(&m, B, T, 1, &bad[1]) == -1, "layers past L were accepted");
        /* The halves of a split backward: in order, on a split arena. */
        int32_t tok[2 * B * T] = {0};
        dt_gpt_part whole = {0, L};
        CHECK(dt_gpt_alloc_slots(&m, B, T, 1, &whole) == 0, "%s", m.error);
        CHECK(dt_gpt_forward_slot(&m, 0, tok, tok + B * T, B, T) >= 0, "%s", m.error);
        CHECK(dt_gpt_backward_part(&m, 0, NULL, 1.0f, DT_BWD_INPUT) == -1,
              "an input half ran on an arena carved without split_backward");
        m.acts.split_backward = 1;
        CHECK(dt_gpt_alloc_slots(&m, B, T, 1, &whole) == 0, "%s", m.error);
        CHECK(dt_gpt_forward_slot(&m, 0, tok, tok + B * T, B, T) >= 0, "%s", m.error);
        CHECK(dt_gpt_backward_part(&m, 0, NULL, 1.0f, DT_BWD_WEIGHTS) == -1,
              "a weight half ran before its input half");
        CHECK(dt_gpt_backward_part(&m, 0, NULL, 1.0f, DT_BWD_INPUT) == 0, "%s", m.error);
        CHECK(dt_gpt_backward_part(&m, 0, NULL, 1.0f, DT_BWD_WHOLE) == -1,
              "a whole backward ran while a weight half was pending");
        CHECK(dt_gpt_backward_part(&m, 0, NULL, 1.0f, DT_BWD_WEIGHTS) == 0, "%s", m.error);
        dt_gpt_destroy(&m);
    }
    return finish("model.parts");
}
