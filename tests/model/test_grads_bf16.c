/* Gradients accumulated in bf16 (dt_gpt.accum.bf16, --grad-accum-dtype bf16):
 *  - over two micro-batches, grads16 holds what fp32 accumulation gives
 *    when its buffer is rounded to bf16 after each micro-batch (the
 *    reference does that rounding itself, on a second model with fp32
 *    gradients and the same weights), on a small model and on one layer
 *    of GPT-2's shapes (vocabulary 50257: segments of uneven sizes, the
 *    embeddings' slot held from the head's backward to their own);
 *  - the optimizer (AdamW, Adam, SGD with momentum) and the gradient norm
 *    read bf16 gradients as the fp32 values they stand for: the same bits
 *    as on an fp32 buffer holding the widened values, over a range that
 *    cuts tensors and is longer than one widened chunk. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/cast.h"
#include "model/gpt.h"
#include "model/optimizer.h"

enum { L = 2, NH = 2, C = 32, V = 67, BLOCK = 16, B = 2, T = 16 };

static int make(dt_gpt *m, int accum16, const dt_gpt_config *cfg, int b, int t)
{
    char err[256] = "";
    if (dt_gpt_create_layout(m, cfg, DT_PREC_BF16, err, sizeof err) || dt_gpt_set_mixed(m) ||
        (accum16 && dt_gpt_set_grads16(m)) || dt_gpt_alloc_params(m) ||
        dt_gpt_alloc_grads(m) || dt_gpt_alloc_acts(m, b, t)) {
        CHECK(0, "model: %s %s", err, m->error);
        return -1;
    }
    dt_gpt_init_weights(m, 9);
    dt_gpt_sync_working(m, 0, m->n_floats);
    dt_gpt_zero_grads(m);
    return 0;
}

static void round_to_bf16(float *x, size_t n)
{
    uint16_t *h = malloc(n * sizeof *h);
    dt_cast_f32_to_bf16(h, x, n);
    dt_cast_bf16_to_f32(x, h, n);
    free(h);
}

static void test_accumulation(const dt_gpt_config *cfg, int b, int t)
{
    dt_gpt a, ref;
    if (make(&a, 1, cfg, b, t) || make(&ref, 0, cfg, b, t)) return;
    int32_t *tok = malloc(2 * (size_t)b * t * sizeof *tok);
    for (int k = 0; k < 2; k++) {
        rng_state = 77 + (uint64_t)k;
        for (int i = 0; i < 2 * b * t; i++) tok[i] = (int32_t)(rnd_u64() % cfg->vocab_size);
        for (dt_gpt *m = &a; m; m = m == &a ? &ref : NULL) {
            if (dt_gpt_forward(m, tok, tok + b * t, b, t) < 0 ||
                dt_gpt_backward(m, tok, b, t, 1.0f / (2 * b * t))) {
                CHECK(0, "micro-batch %d: %s", k, m->error);
                free(tok);
                return;
            }
        }
        round_to_bf16(ref.grads, ref.n_floats);
    }
    free(tok);
    float *got = malloc(a.n_floats * sizeof *got);
    dt_cast_bf16_to_f32(got, a.accum.grads16, a.n_floats);
    size_t diff = 0, nonzero = 0, first = 0;
    for (size_t i = a.n_floats; i-- > 0;) {
        if (memcmp(&got[i], &ref.grads[i], sizeof(float))) diff++, first = i;
        nonzero += got[i] != 0.0f;
    }
    CHECK(diff == 0, "%zu of %zu bf16 sums differ from fp32 rounded per micro-batch, first at "
          "%zu (%.9g vs %.9g)", diff, a.n_floats, first, got[first], ref.grads[first]);
    CHECK(nonzero > a.n_params / 2, "the gradients are not all zero (%zu)", nonzero);
    free(got);
    dt_gpt_destroy(&a);
    dt_gpt_destroy(&ref);
}

static void test_optimizer_reads(void)
{
    dt_gpt m;
    dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C,
                         .vocab_size = V, .block_size = BLOCK};
    char err[256];
    if (dt_gpt_create(&m, &cfg, DT_PREC_F32, err, sizeof err)) {
        CHECK(0, "model: %s", err);
        return;
    }
    const size_t n = m.n_floats;
    uint16_t *g16 = calloc(n, sizeof *g16);
    float *g32 = calloc(n, sizeof *g32), *p16 = malloc(n * sizeof *p16),
          *p32 = malloc(n * sizeof *p32);
    rng_state = 5;
    for (size_t i = 0; i < n; i++) g32[i] = (float)(rnd_u64() % 20001) * 1e-4f - 1.0f;
    dt_cast_f32_to_bf16(g16, g32, n);
    dt_cast_bf16_to_f32(g32, g16, n);
    dt_gbuf b16 = {NULL, g16}, b32 = dt_gbuf_f32(g32);
    CHECK(dt_grad_norm(&m, b16) == dt_grad_norm(&m, b32) && dt_grad_norm(&m, b16) > 0,
          "norm of bf16 %.17g, of its fp32 values %.17g", dt_grad_norm(&m, b16),
          dt_grad_norm(&m, b32));
    /* A range from inside wte to inside the first layer: several chunks. */
    const size_t lo = 37, hi = dt_gpt_segment_start(&m, 2) - 5;
    CHECK(hi - lo > 2 * DT_GBUF_CHUNK, "the range spans chunks (%zu)", hi - lo);
    const dt_opt_kind kinds[] = {DT_OPT_ADAMW, DT_OPT_ADAM, DT_OPT_SGD};
    for (int k = 0; k < 3; k++) {
        dt_optimizer o16, o32;
        if (dt_optimizer_init(&o16, kinds[k], n, 0.9, 0.95, 1e-8, 0.1, 0.9) ||
            dt_optimizer_init(&o32, kinds[k], n, 0.9, 0.95, 1e-8, 0.1, 0.9)) {
            CHECK(0, "optimizer state");
            return;
        }
        memcpy(p16, m.params, n * sizeof(float));
        memcpy(p32, m.params, n * sizeof(float));
        for (int step = 0; step < 3; step++) {
            dt_optimizer_step(&o16, &m, p16, b16, lo, hi, 1e-2, 0.5f);
            dt_optimizer_step(&o32, &m, p32, b32, lo, hi, 1e-2, 0.5f);
        }
        CHECK(!memcmp(p16, p32, n * sizeof(float)) && !memcmp(o16.m, o32.m, n * sizeof(float)),
              "%s: bf16 gradients update as their fp32 values do", dt_opt_kind_name(kinds[k]));
        CHECK(memcmp(p16, m.params, n * sizeof(float)) != 0, "%s: the step changed the weights",
              dt_opt_kind_name(kinds[k]));
        dt_optimizer_free(&o16);
        dt_optimizer_free(&o32);
    }
    free(g16), free(g32), free(p16), free(p32);
    dt_gpt_destroy(&m);
}

int main(void)
{
    const dt_gpt_config small = {.n_layer = L, .n_head = NH, .n_embd = C, .vocab_size = V,
                                 .block_size = BLOCK};
    const dt_gpt_config gpt2 = {.n_layer = 1, .n_head = 12, .n_embd = 768, .vocab_size = 50257,
                                .block_size = 1024};
    test_accumulation(&small, B, T);
    test_accumulation(&gpt2, 1, 24);
    test_optimizer_reads();
    return finish("test_grads_bf16");
}
