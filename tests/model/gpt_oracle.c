/* Runs one forward and backward of dtrain's GPT on given weights and tokens
 * and writes what PyTorch is compared against: logits, loss, and every
 * parameter's gradient.
 *
 *   gpt_oracle WEIGHTS.safetensors TOKENS.i32 OUT.safetensors B T [fp32|bf16]
 *
 * TOKENS holds B*T int32 inputs, then B*T int32 targets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/threads.h"
#include "model/gpt.h"
#include "train/weights/weights.h"

static int fail(const char *msg)
{
    fprintf(stderr, "gpt_oracle: %s\n", msg);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 6) return fail("usage: gpt_oracle WEIGHTS TOKENS OUT B T [fp32|bf16]");
    int B = atoi(argv[4]), T = atoi(argv[5]);
    dt_precision prec = argc > 6 && strcmp(argv[6], "bf16") == 0 ? DT_PREC_BF16 : DT_PREC_F32;
    char err[1024];
    dt_gpt_config cfg;
    dt_gpt m;
    dt_kernels_set_threads(1);
    if (dt_weights_inspect(argv[1], &cfg, err, sizeof err)) return fail(err);
    if (dt_gpt_create(&m, &cfg, prec, err, sizeof err)) return fail(err);
    if (dt_weights_load(&m, argv[1], err, sizeof err)) return fail(err);
    if (dt_gpt_alloc_grads(&m) || dt_gpt_alloc_acts(&m, B, T)) return fail(m.error);

    size_t n = (size_t)B * T;
    int32_t *tok = malloc(2 * n * sizeof *tok);
    FILE *f = fopen(argv[2], "rb");
    if (!tok || !f || fread(tok, sizeof *tok, 2 * n, f) != 2 * n) return fail("cannot read tokens");
    fclose(f);

    double loss = dt_gpt_forward(&m, tok, tok + n, B, T);
    if (loss < 0) return fail(m.error);
    /* Keep the logits before backward turns them into their gradient. */
    size_t nl = n * (size_t)cfg.vocab_size;
    float *logits = malloc(nl * sizeof *logits);
    memcpy(logits, m.acts.logits, nl * sizeof *logits);
    if (dt_gpt_backward(&m, tok, B, T, 1.0f / (float)n)) return fail(m.error);

    /* The gradients under "grad." names, then logits and loss. */
    const float *bufs[1] = {m.grads};
    const char *prefixes[1] = {"grad."};
    if (dt_weights_write(&m, bufs, prefixes, 1, argv[3], err, sizeof err)) return fail(err);
    char extra[4200];
    snprintf(extra, sizeof extra, "%s.extra", argv[3]);
    float lossf = (float)loss;
    dt_st_entry e[2] = {
        {.name = "logits", .data = logits, .ndim = 2, .shape = {(int64_t)n, cfg.vocab_size}},
        {.name = "loss", .data = &lossf, .ndim = 1, .shape = {1}},
    };
    if (dt_st_write_f32(extra, e, 2, err, sizeof err)) return fail(err);
    free(logits);
    free(tok);
    dt_gpt_destroy(&m);
    return 0;
}
