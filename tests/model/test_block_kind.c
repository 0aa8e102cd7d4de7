/* A block kind the library does not have, added from outside by
 * docs/design.md's checklist alone: "scale", a branch that adds its
 * norm's output times a learned gain per channel to the residual stream,
 *
 *     y = x + g * norm(x),   g [C] (h.{i}.NAME.gain), starting at ones.
 *
 * It keeps its residual sum (a product's place: the full recompute mode
 * rebuilds it) and, for a split backward, the sum's gradient. Tensor
 * parallelism leaves it whole; under sequence parallelism each rank has
 * its rows of the sum and of the gain's gradient (summed over the group).
 *
 *   test_block_kind unit      the registry, the blocks string, the layout,
 *                             recompute and the split backward (bits)
 *   test_block_kind oracle W TOKENS OUT B T BLOCKS
 *                             one forward and backward on weights W, for
 *                             test_block_kind.py to hold against PyTorch
 *   test_block_kind train ARGS
 *                             the library's trainer with the kind known, as
 *                             `dtrain train ARGS` (test_block_kind.py runs
 *                             it under DDP, ZeRO-3, tp + sp and a zb1p
 *                             pipeline, none of which knows the kind) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/threads.h"
#include "model/block.h"
#include "model/gpt.h"
#include "model/model_internal.h"
#include "train/config/config.h"
#include "train/trainer.h"
#include "train/weights/weights.h"

/* ---- the kind ------------------------------------------------------------ */

enum { RES, D_OUT, N_ACTS };

static int scale_tensors(const dt_gpt_config *cfg, const dt_gpt_tp *tp, const dt_gpt_ep *ep,
                   dt_tensor_spec *out)
{
    (void)ep;
    (void)tp; /* whole on every rank */
    out[0] = (dt_tensor_spec){"gain", cfg->n_embd, 0, {0}, DT_INIT_ONE, 0, 0};
    return 1;
}

static int scale_acts(const dt_gpt *m, size_t N, size_t R, dt_act_spec *out)
{
    (void)N;
    out[RES] = (dt_act_spec){R * (size_t)m->cfg.n_embd, DT_ACT_PRODUCT};
    out[D_OUT] = (dt_act_spec){R * (size_t)m->cfg.n_embd, DT_ACT_SPLIT};
    return N_ACTS;
}

static int scale_forward(dt_gpt *m, const dt_block_call *c, unsigned run)
{
    if (!(run & DT_RUN_OUTPUT)) return 0;
    const size_t C = (size_t)m->cfg.n_embd, R = dt_model_region_rows(m, (size_t)c->N);
    const float *x = c->x + dt_model_region_first(m, (size_t)c->N) * C, *g = c->w[0];
    for (size_t i = 0; i < R; i++)
        for (size_t j = 0; j < C; j++)
            c->a[RES][i * C + j] = c->res[i * C + j] + g[j] * x[i * C + j];
    return 0;
}

/* dgain += sum over this rank's rows of d(sum) * x (and over the group). */
static int scale_gain_grad(dt_gpt *m, const dt_block_call *c, const float *d)
{
    const size_t C = (size_t)m->cfg.n_embd, R = dt_model_region_rows(m, (size_t)c->N);
    const float *x = c->x + dt_model_region_first(m, (size_t)c->N) * C;
    float *part = dt_model_region_grads_begin(m, C), *dg = part ? part : c->g[0];
    for (size_t i = 0; i < R; i++)
        for (size_t j = 0; j < C; j++) dg[j] += d[i * C + j] * x[i * C + j];
    return part ? dt_model_region_grads_end(m, c->g, 1, C, "scale") : 0;
}

static int scale_backward(dt_gpt *m, const dt_block_call *c, dt_bwd_part what)
{
    const size_t C = (size_t)m->cfg.n_embd, R = dt_model_region_rows(m, (size_t)c->N);
    const float *d = m->acts.d_res, *g = c->w[0];
    for (size_t i = 0; i < R; i++)
        for (size_t j = 0; j < C; j++) m->acts.d_c[i * C + j] = d[i * C + j] * g[j];
    if (what == DT_BWD_WHOLE) return scale_gain_grad(m, c, d);
    memcpy(c->a[D_OUT], d, R * C * sizeof(float));
    return 0;
}

static int scale_weights(dt_gpt *m, const dt_block_call *c)
{
    return scale_gain_grad(m, c, c->a[D_OUT]);
}

static double scale_flops(const dt_gpt_config *cfg, int T)
{
    (void)cfg, (void)T;
    return 0;
}

static const dt_block_kind scale_kind = {
    .name = "scale",
    .role = DT_BLOCK_BRANCH,
    .tensors = scale_tensors,
    .acts = scale_acts,
    .forward = scale_forward,
    .backward = scale_backward,
    .weights = scale_weights,
    .flops = scale_flops,
};

static const char BLOCKS[] = "ln_1:layernorm,attn:attention,ln_2:layernorm,gate:scale";

/* ---- unit ---------------------------------------------------------------- */

enum { L = 2, NH = 2, C = 16, V = 37, BLOCK = 12, B = 2, T = 11 };

static void check_registry(void)
{
    char err[256] = "";
    dt_block_kind nameless = scale_kind, mlp = scale_kind;
    nameless.forward = NULL;
    mlp.name = "mlp";
    CHECK_ERR(dt_block_register(&scale_kind, err, sizeof err), err, "scale", "taken");
    CHECK_ERR(dt_block_register(&nameless, err, sizeof err), err, "forward");
    CHECK_ERR(dt_block_register(&mlp, err, sizeof err), err, "mlp", "taken");
    CHECK(dt_block_find("scale") == &scale_kind, "the registered kind is found by name");

    dt_block b[DT_LAYER_MAX_BLOCKS];
    CHECK_ERR(dt_blocks_parse("ln_1:layernorm,g:gain", b, err, sizeof err) >= 0 ? 0 : -1, err,
              "no block kind called 'gain'", "layernorm");
    CHECK_ERR(dt_blocks_parse("ln_1:layernorm,ln_2:layernorm", b, err, sizeof err) >= 0 ? 0 : -1,
              err, "block 2 (ln_2:layernorm) should be a branch");
    CHECK_ERR(dt_blocks_parse("ln_1:layernorm", b, err, sizeof err) >= 0 ? 0 : -1, err,
              "pairs of a norm and a branch", "1 blocks");
    CHECK_ERR(dt_blocks_parse("a:layernorm,b:scale,a:layernorm,c:mlp", b, err,
                              sizeof err) >= 0 ? 0 : -1, err, "two blocks are called a");
    CHECK_ERR(dt_blocks_parse("ln_1layernorm,x:mlp", b, err, sizeof err) >= 0 ? 0 : -1, err,
              "is not name:kind");
    CHECK(dt_blocks_parse(BLOCKS, b, err, sizeof err) == 4 && b[3].kind == &scale_kind &&
          b[3].last && !b[1].last, "the blocks string: %s", err);
    CHECK(dt_blocks_same("", "ln_1:layernorm attn:attention,ln_2:layernorm mlp:mlp") &&
          !dt_blocks_same("", BLOCKS), "GPT-2's blocks are the default, whatever the separators");
}

static dt_gpt_config config(void)
{
    dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C, .vocab_size = V,
                         .block_size = BLOCK};
    strcpy(cfg.blocks, BLOCKS);
    return cfg;
}

/* Names in the layout's order, and the counts by the kinds' shapes worked
 * out here: attention 4 C^2 + 4 C, two LayerNorms 4 C, the gain C. */
static void check_layout(void)
{
    dt_gpt m;
    char err[256];
    dt_gpt_config cfg = config();
    if (dt_gpt_create_layout(&m, &cfg, DT_PREC_F32, err, sizeof err)) {
        CHECK(0, "layout: %s", err);
        return;
    }
    const char *want[] = {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias",
                          "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
                          "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias", "h.0.ln_2.weight",
                          "h.0.ln_2.bias", "h.0.gate.gain", "h.1.ln_1.weight"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(!strcmp(m.tensors[i].name, want[i]), "tensor %zu is %s, want %s", i,
              m.tensors[i].name, want[i]);
    CHECK(m.n_tensors == 2 + 9 * L + 2, "%d tensors", m.n_tensors);
    const size_t psi = (size_t)V * C + (size_t)BLOCK * C + L * (4 * C * C + 4 * C + 4 * C + C) +
                       2 * C;
    CHECK(m.n_params == psi && dt_gpt_param_count(&cfg) == psi, "Psi %zu / %zu, want %zu",
          m.n_params, dt_gpt_param_count(&cfg), psi);
    const double flops = 6.0 * V * C + L * (6.0 * 4 * C * C + 6.0 * T * C);
    CHECK(dt_gpt_flops_per_token(&cfg, T) == flops, "flops %.17g, want %.17g",
          dt_gpt_flops_per_token(&cfg, T), flops);
    dt_gpt_destroy(&m);
}

/* One micro-batch's gradients with the given recompute mode and backward
 * (whole, or its two halves); 0 or -1. */
static int grads(dt_recompute mode, int split, const int32_t *tok, float **out, size_t *n)
{
    dt_gpt m;
    char err[256];
    dt_gpt_config cfg = config();
    if (dt_gpt_create(&m, &cfg, DT_PREC_F32, err, sizeof err)) {
        CHECK(0, "%s", err);
        return -1;
    }
    dt_gpt_init_weights(&m, 7);
    for (size_t i = 0; i < m.n_floats; i++) m.params[i] += 0.01f * (float)((i * 7919) % 13);
    m.acts.recompute = mode;
    m.acts.split_backward = split;
    int rc = dt_gpt_alloc_grads(&m) || dt_gpt_alloc_acts(&m, B, T);
    if (!rc) dt_gpt_zero_grads(&m);
    rc = rc || dt_gpt_forward(&m, tok, tok + B * T, B, T) < 0;
    if (!rc && split)
        rc = dt_gpt_backward_part(&m, 0, NULL, 1.0f / (B * T), DT_BWD_INPUT) ||
             dt_gpt_backward_part(&m, 0, NULL, 0, DT_BWD_WEIGHTS);
    else if (!rc)
        rc = dt_gpt_backward(&m, tok, B, T, 1.0f / (B * T));
    CHECK(!rc, "%s%s: %s", dt_recompute_name(mode), split ? ", split" : "", m.error);
    *n = m.n_floats;
    *out = malloc(m.n_floats * sizeof **out);
    if (*out) memcpy(*out, m.grads, m.n_floats * sizeof **out);
    dt_gpt_destroy(&m);
    return rc ? -1 : 0;
}

/* The model rebuilds what the kind's buffer classes say, and runs its
 * weight half, without knowing the kind: the same bits every way. */
static void check_recompute_split(void)
{
    int32_t tok[2 * B * T];
    for (int i = 0; i < 2 * B * T; i++) tok[i] = (int32_t)((i * 31 + 7) % V);
    float *ref = NULL, *got = NULL;
    size_t n = 0, k = 0;
    if (grads(DT_RECOMPUTE_NONE, 0, tok, &ref, &n)) return;
    const dt_recompute modes[] = {DT_RECOMPUTE_NONE, DT_RECOMPUTE_SELECTIVE, DT_RECOMPUTE_FULL};
    for (int i = 0; i < 3; i++)
        for (int split = 0; split < 2; split++) {
            if (i == 0 && !split) continue;
            if (grads(modes[i], split, tok, &got, &k) == 0)
                CHECK(k == n && !memcmp(got, ref, n * sizeof *ref),
                      "%s%s: gradients differ from the whole backward's",
                      dt_recompute_name(modes[i]), split ? ", split" : "");
            free(got);
        }
    free(ref);
}

/* ---- oracle, train ------------------------------------------------------- */

static int fail(const char *what, const char *why)
{
    fprintf(stderr, "test_block_kind: %s: %s\n", what, why);
    return 1;
}

static int oracle(int argc, char **argv)
{
    if (argc < 8) return fail("usage", "oracle WEIGHTS TOKENS OUT B T BLOCKS");
    const int b = atoi(argv[5]), t = atoi(argv[6]);
    char err[1024];
    dt_gpt_config cfg;
    dt_gpt m;
    dt_kernels_set_threads(1);
    if (dt_weights_inspect(argv[2], &cfg, err, sizeof err)) return fail(argv[2], err);
    snprintf(cfg.blocks, sizeof cfg.blocks, "%s", argv[7]);
    if (dt_gpt_create(&m, &cfg, DT_PREC_F32, err, sizeof err) ||
        dt_weights_load(&m, argv[2], err, sizeof err))
        return fail(argv[2], err);
    if (dt_gpt_alloc_grads(&m) || dt_gpt_alloc_acts(&m, b, t)) return fail("model", m.error);
    const size_t n = (size_t)b * t;
    int32_t *tok = malloc(2 * n * sizeof *tok);
    FILE *f = fopen(argv[3], "rb");
    if (!tok || !f || fread(tok, sizeof *tok, 2 * n, f) != 2 * n) return fail(argv[3], "short");
    fclose(f);
    dt_gpt_zero_grads(&m);
    const double loss = dt_gpt_forward(&m, tok, tok + n, b, t);
    if (loss < 0 || dt_gpt_backward(&m, tok, b, t, 1.0f / (float)n)) return fail("run", m.error);
    const float *bufs[1] = {m.grads};
    const char *prefixes[1] = {"grad."};
    if (dt_weights_write(&m, bufs, prefixes, 1, argv[4], err, sizeof err))
        return fail(argv[4], err);
    printf("loss %.9g\n", loss);
    free(tok);
    dt_gpt_destroy(&m);
    return 0;
}

static int train(int argc, char **argv)
{
    dt_train_config c;
    char err[1024];
    dt_config_defaults(&c);
    int rc = dt_config_parse_args(&c, argc - 1, argv + 1, err, sizeof err);
    if (rc == 0) rc = dt_train(&c, err, sizeof err);
    if (rc != 0) fprintf(stderr, "test_block_kind: %s\n", err);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    char err[256];
    if (dt_block_register(&scale_kind, err, sizeof err)) return fail("register", err);
    if (argc > 1 && !strcmp(argv[1], "oracle")) return oracle(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "train")) return train(argc, argv);
    check_registry();
    check_layout();
    check_recompute_split();
    return finish("test_block_kind");
}
