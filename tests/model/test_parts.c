/* The model cut into parts, as pipeline stages run it, in one process:
 * micro-batches forward through every part (each in its own activation
 * slot, several in flight at once), then backward from the last part to
 * the first, each part handing its input's gradient to the part before.
 * The losses and every gradient must be the bits of the whole model run
 * one micro-batch at a time: the same kernels on the same inputs, and the
 * gradients accumulated in the same order (the head's share of wte before
 * the embeddings', micro-batch by micro-batch). Checked for cuts into 2
 * and 3 parts, with 3 micro-batches in flight, in every recompute mode,
 * and that each segment reports grad_ready once per backward. */
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
    dt_gpt_config cfg = {L, NH, C, V, BLOCK};
    char err[256] = "";
    m->recompute = DT_RECOMPUTE_NONE;
    if (dt_gpt_create(m, &cfg, DT_PREC_F32, err, sizeof err) || dt_gpt_alloc_grads(m)) {
        CHECK(0, "model: %s %s", err, m->error);
        return -1;
    }
    m->recompute = mode;
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

/* Parts [cut[j], cut[j+1]); slot j * M + i holds micro-batch i of part j. */
static int run_parts(dt_gpt *m, const int32_t *tok, const int *cut, int nparts, double *loss)
{
    dt_gpt_part parts[3 * M];
    for (int j = 0; j < nparts; j++)
        for (int i = 0; i < M; i++) parts[j * M + i] = (dt_gpt_part){cut[j], cut[j + 1]};
    if (dt_gpt_alloc_slots(m, B, T, nparts * M, parts)) { CHECK(0, "%s", m->error); return -1; }
    m->grad_ready = on_ready;
    m->grad_ready_ctx = m;
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
            if (dt_gpt_backward_slot(m, k, j == nparts - 1 ? NULL : d, 1.0f / (M * B * T)))
            { free(d); CHECK(0, "backward part %d: %s", j, m->error); return -1; }
            if (j > 0) memcpy(d, dt_gpt_slot_input(m, k), sizeof(float) * B * T * C);
        }
        /* Segment 0 twice: once for the head's tied copy, once after the embeddings. */
        for (int s = 0; s < L + 2; s++)
            CHECK(ready[s] == (s == 0 && nparts > 1 ? 2 : 1),
                  "segment %d reported %d times in micro-batch %d", s, ready[s], i);
    }
    free(d);
    m->grad_ready = NULL;
    return 0;
}

static void compare(dt_recompute mode, const int *cut, int nparts)
{
    check_set_label("%s, %d parts: ", dt_recompute_name(mode), nparts);
    dt_gpt whole, cutm;
    int32_t tok[M * 2 * B * T];
    rng_state = 31;
    for (size_t i = 0; i < sizeof tok / sizeof tok[0]; i++) tok[i] = (int32_t)(rnd_u64() % V);
    double lw[M], lp[M];
    if (make(&whole, mode) || make(&cutm, mode) || run_whole(&whole, tok, lw) ||
        run_parts(&cutm, tok, cut, nparts, lp))
        goto out;
    for (int i = 0; i < M; i++)
        CHECK(lw[i] == lp[i], "micro-batch %d loss %.17g, whole %.17g", i, lp[i], lw[i]);
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < whole.n_floats; i++)
        if (memcmp(&whole.grads[i], &cutm.grads[i], sizeof(float)) && diff++ == 0) first = i;
    CHECK(diff == 0, "%zu gradients differ from the whole model's, first at float %zu", diff,
          first);
out:
    dt_gpt_destroy(&whole);
    dt_gpt_destroy(&cutm);
}

int main(void)
{
    const int two[] = {0, 1, L}, three[] = {0, 2, 3, L};
    for (int mode = DT_RECOMPUTE_NONE; mode <= DT_RECOMPUTE_FULL; mode++) {
        compare((dt_recompute)mode, two, 2);
        compare((dt_recompute)mode, three, 3);
    }
    /* A part must hold a layer, inside the model. */
    dt_gpt m;
    if (make(&m, DT_RECOMPUTE_NONE) == 0) {
        dt_gpt_part bad[] = {{0, 0}, {2, 5}};
        check_set_label("refusals: ");
        CHECK(dt_gpt_alloc_slots(&m, B, T, 1, &bad[0]) == -1, "an empty part was accepted");
        CHECK(dt_gpt_alloc_slots(&m, B, T, 1, &bad[1]) == -1, "layers past L were accepted");
        dt_gpt_destroy(&m);
    }
    return finish("model.parts");
}
