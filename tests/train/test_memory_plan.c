/*
 * The memory plan (train/memory/plan.h) against figures computed by hand:
 * GPT-2 small (Psi = 124,439,808) at ZeRO stages 0-3 over 1, 2 and 4 ranks
 * in fp32 with AdamW, a small model in bf16 mixed precision and with SGD,
 * the transient windows from the layout's segment sizes counted by hand,
 * the activation estimate against what dt_gpt_alloc_acts accounts, the
 * printed table, and bad input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/alloc.h"
#include "model/gpt.h"
#include "train/memory/plan.h"
#include "train/metrics.h"

static char err[512];

static dt_mem_plan_opts opts(int stage, int ranks, dt_precision prec, dt_opt_kind opt,
                             double momentum, int B, int T)
{
    return (dt_mem_plan_opts){.zero_stage = stage, .ranks = ranks, .prec = prec, .opt = opt,
                              .momentum = momentum, .B = B, .T = T, .prefetch = 1};
}

static const dt_gpt_config gpt2 = {.n_layer = 12, .n_head = 12, .n_embd = 768,
                                   .vocab_size = 50257, .block_size = 1024};

/* Bytes per rank (params, grads, optimizer) for Psi = 124,439,808:
 * 4 Psi = 497,759,232; 4 Psi / 2 = 248,879,616; 4 Psi / 4 = 124,439,808;
 * 8 Psi = 995,518,464; 8 Psi / 2 = 497,759,232; 8 Psi / 4 = 248,879,616. */
static const struct { int ranks, stage; double params, grads, optim; } gpt2_fp32[] = {
    {1, 0, 497759232, 497759232, 995518464}, {1, 1, 497759232, 497759232, 995518464},
    {1, 2, 497759232, 497759232, 995518464}, {1, 3, 497759232, 497759232, 995518464},
    {2, 0, 497759232, 497759232, 995518464}, {2, 1, 497759232, 497759232, 497759232},
    {2, 2, 497759232, 248879616, 497759232}, {2, 3, 248879616, 248879616, 497759232},
    {4, 0, 497759232, 497759232, 995518464}, {4, 1, 497759232, 497759232, 248879616},
    {4, 2, 497759232, 124439808, 248879616}, {4, 3, 124439808, 124439808, 248879616},
};

static void test_gpt2_fp32(void)
{
    dt_gpt layout;
    CHECK(dt_gpt_create_layout(&layout, &gpt2, DT_PREC_F32, err, sizeof err) == 0, "%s", err);
    for (size_t i = 0; i < sizeof gpt2_fp32 / sizeof gpt2_fp32[0]; i++) {
        dt_mem_plan p;
        dt_mem_plan_opts o = opts(gpt2_fp32[i].stage, gpt2_fp32[i].ranks, DT_PREC_F32,
                                  DT_OPT_ADAMW, 0, 1, 1024);
        CHECK(dt_mem_plan_make(&layout, &o, &p, err, sizeof err) == 0, "%s", err);
        CHECK(p.psi == 124439808u, "Psi %zu", p.psi);
        CHECK(p.param_bytes == 4 && p.grad_bytes == 4 && p.optim_bytes == 8, "P G K %d %d %d",
              p.param_bytes, p.grad_bytes, p.optim_bytes);
        CHECK(p.bytes[DT_MEM_PARAMS] == gpt2_fp32[i].params &&
                  p.bytes[DT_MEM_GRADS] == gpt2_fp32[i].grads &&
                  p.bytes[DT_MEM_OPTIM] == gpt2_fp32[i].optim,
              "N %d stage %d: %.0f %.0f %.0f, want %.0f %.0f %.0f", gpt2_fp32[i].ranks,
              gpt2_fp32[i].stage, p.bytes[DT_MEM_PARAMS], p.bytes[DT_MEM_GRADS],
              p.bytes[DT_MEM_OPTIM], gpt2_fp32[i].params, gpt2_fp32[i].grads,
              gpt2_fp32[i].optim);
        double sum = gpt2_fp32[i].params + gpt2_fp32[i].grads + gpt2_fp32[i].optim;
        CHECK(dt_mem_plan_state(&p) == sum, "state %.0f want %.0f", dt_mem_plan_state(&p), sum);
        CHECK(p.bytes[DT_MEM_COMM] == 0 && p.bytes[DT_MEM_OTHER] == 0, "no formula for comm");
    }
    dt_gpt_destroy(&layout);
}

/* L2 H2 C8 V16 block 8: Psi = V C + T C + L (12 C^2 + 13 C) + 2 C
 * = 128 + 64 + 2 x 872 + 16 = 1952. Tensors start on 16 floats (64
 * bytes), so a layer's segment is 16 (ln_1.weight, 8) + 16 (ln_1.bias) +
 * 192 (c_attn.weight) + 32 (c_attn.bias, 24) + 64 (attn.c_proj.weight) +
 * 16 (its bias) + 16 + 16 (ln_2) + 256 (c_fc.weight) + 32 (c_fc.bias) +
 * 256 (mlp.c_proj.weight) + 16 (its bias) = 928 floats, larger than the
 * embeddings' 128 + 64 = 192 and ln_f's 32. */
static const dt_gpt_config small = {.n_layer = 2, .n_head = 2, .n_embd = 8,
                                    .vocab_size = 16, .block_size = 8};

static void test_small_mixed_and_sgd(void)
{
    dt_gpt layout;
    dt_mem_plan p;
    CHECK(dt_gpt_create_layout(&layout, &small, DT_PREC_BF16, err, sizeof err) == 0, "%s", err);
    /* bf16 AdamW with fp32 gradient accumulation (the default): 2 + 4
     * bytes, K = 12 (fp32 master + two moments). Beyond the formula, the
     * segment in use widened to fp32: a layer, 928 x 4 bytes (more than the
     * head's 192 + 32). */
    dt_mem_plan_opts o = opts(0, 4, DT_PREC_BF16, DT_OPT_ADAMW, 0, 2, 8);
    CHECK(dt_mem_plan_make(&layout, &o, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.psi == 1952 && p.bytes[DT_MEM_PARAMS] == 3904 && p.bytes[DT_MEM_GRADS] == 7808 &&
              p.bytes[DT_MEM_OPTIM] == 23424, "bf16 DDP: %zu %.0f %.0f %.0f", p.psi,
          p.bytes[DT_MEM_PARAMS], p.bytes[DT_MEM_GRADS], p.bytes[DT_MEM_OPTIM]);
    CHECK(p.window_grads == 0 && p.window_params == 0 && p.window_widened == 3712,
          "DDP: only the widened window, %.0f", p.window_widened);
    /* bf16 gradients, the field's classic table: 2 + 2 + 12. Backward
     * still adds in fp32, into a widened window: the embeddings' from the
     * head on, with a layer's (192 + 928, more than the head's 192 + 32)
     * x 4 bytes. */
    o.grads_bf16 = 1;
    CHECK(dt_mem_plan_make(&layout, &o, &p, err, sizeof err) == 0 &&
              p.bytes[DT_MEM_GRADS] == 3904 && dt_mem_plan_state(&p) == 31232,
          "bf16 DDP, bf16 gradients: %.0f", dt_mem_plan_state(&p));
    CHECK(p.window_grads == 4480, "bf16 accumulation's window %.0f", p.window_grads);
    /* ZeRO-1: (2 + 2) Psi + 12 Psi / 4 = 7808 + 5856. */
    o.zero_stage = 1;
    CHECK(dt_mem_plan_make(&layout, &o, &p, err, sizeof err) == 0 && dt_mem_plan_state(&p) == 13664,
          "bf16 ZeRO-1: %.0f", dt_mem_plan_state(&p));
    /* ZeRO-2: 2 Psi + (2 + 12) Psi / 4 = 3904 + 6832; beyond it, one
     * micro-batch's fp32 gradients kept whole during backward: the
     * embeddings' (the tied weight's last term comes last) and two
     * layers', (192 + 2 x 928) x 4 bytes. */
    o.zero_stage = 2;
    CHECK(dt_mem_plan_make(&layout, &o, &p, err, sizeof err) == 0 && dt_mem_plan_state(&p) == 10736,
          "bf16 ZeRO-2: %.0f", dt_mem_plan_state(&p));
    CHECK(p.window_grads == 8192 && p.window_params == 0, "ZeRO-2 windows %.0f %.0f",
          p.window_grads, p.window_params);
    /* ZeRO-3: 16 Psi / 4 = 7808; two gathered layers of bf16 parameters
     * (more than the head's embeddings and ln_f, 192 + 32). */
    o.zero_stage = 3;
    CHECK(dt_mem_plan_make(&layout, &o, &p, err, sizeof err) == 0 && dt_mem_plan_state(&p) == 7808,
          "bf16 ZeRO-3: %.0f", dt_mem_plan_state(&p));
    CHECK(p.window_grads == 8192 && p.window_params == 3712, "ZeRO-3 windows %.0f %.0f",
          p.window_grads, p.window_params);
    o.prefetch = 3;
    CHECK(dt_mem_plan_make(&layout, &o, &p, err, sizeof err) == 0 && p.window_params == 7424,
          "prefetch 3: %.0f", p.window_params);
    /* SGD: K = 8 in bf16 with momentum (master + momentum), 4 without;
     * in fp32 4 with momentum, 0 without. Stage 1 over 2 ranks. */
    static const struct { dt_precision prec; double momentum, optim; } sgd[] = {
        {DT_PREC_BF16, 0.9, 7808}, {DT_PREC_BF16, 0, 3904},
        {DT_PREC_F32, 0.9, 3904},  {DT_PREC_F32, 0, 0},
    };
    for (size_t i = 0; i < sizeof sgd / sizeof sgd[0]; i++) {
        o = opts(1, 2, sgd[i].prec, DT_OPT_SGD, sgd[i].momentum, 2, 8);
        o.grads_bf16 = 1;
        CHECK(dt_mem_plan_make(&layout, &o, &p, err, sizeof err) == 0 &&
                  p.bytes[DT_MEM_OPTIM] == sgd[i].optim,
              "sgd %d momentum %g: %.0f want %.0f", (int)sgd[i].prec, sgd[i].momentum,
              p.bytes[DT_MEM_OPTIM], sgd[i].optim);
    }
    /* Adam (not W) keeps the same state as AdamW: fp32, stage 0, 8 Psi. */
    o = opts(0, 1, DT_PREC_F32, DT_OPT_ADAM, 0, 2, 8);
    CHECK(dt_mem_plan_make(&layout, &o, &p, err, sizeof err) == 0 &&
              p.bytes[DT_MEM_OPTIM] == 15616, "adam: %.0f", p.bytes[DT_MEM_OPTIM]);
    dt_gpt_destroy(&layout);
}

/* The estimate is what the model then allocates for that micro-batch. */
static void test_acts_match_allocation(void)
{
    const int shapes[][2] = {{2, 8}, {3, 5}, {1, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        dt_gpt m;
        dt_mem_plan p;
        CHECK(dt_gpt_create(&m, &small, DT_PREC_F32, err, sizeof err) == 0, "%s", err);
        dt_mem_plan_opts o = opts(0, 1, DT_PREC_F32, DT_OPT_ADAMW, 0, shapes[i][0], shapes[i][1]);
        CHECK(dt_mem_plan_make(&m, &o, &p, err, sizeof err) == 0, "%s", err);
        size_t before = dt_mem_current(DT_MEM_ACTS);
        CHECK(dt_gpt_alloc_acts(&m, shapes[i][0], shapes[i][1]) == 0, "%s", m.error);
        double held = (double)(dt_mem_current(DT_MEM_ACTS) - before);
        CHECK(held > 0 && p.bytes[DT_MEM_ACTS] == held, "%d x %d: estimate %.0f, allocated %.0f",
              shapes[i][0], shapes[i][1], p.bytes[DT_MEM_ACTS], held);
        dt_gpt_destroy(&m);
    }
}

static void test_config(void)
{
    dt_gpt layout;
    dt_mem_plan p;
    dt_train_config c;
    CHECK(dt_gpt_create_layout(&layout, &small, DT_PREC_F32, err, sizeof err) == 0, "%s", err);
    dt_config_defaults(&c);
    c.zero_stage = 2, c.batch_size = 3, c.seq_len = 0;
    strcpy(c.dtype, "bf16");
    strcpy(c.optimizer, "sgd");
    c.momentum = 0.5;
    CHECK(dt_mem_plan_from_config(&layout, &c, 4, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.o.zero_stage == 2 && p.o.ranks == 4 && p.o.prec == DT_PREC_BF16 &&
              p.o.opt == DT_OPT_SGD && p.o.B == 3 && p.o.T == 8 && p.optim_bytes == 8,
          "from config: stage %d N %d prec %d opt %d %d x %d K %d", p.o.zero_stage, p.o.ranks,
          (int)p.o.prec, (int)p.o.opt, p.o.B, p.o.T, p.optim_bytes);
    dt_gpt_destroy(&layout);
}

/* The table shows each formula, its figure in MiB, and each rank's measured
 * bytes with the ratio to the formula. */
static void test_print(void)
{
    dt_gpt layout;
    dt_mem_plan p;
    CHECK(dt_gpt_create_layout(&layout, &gpt2, DT_PREC_F32, err, sizeof err) == 0, "%s", err);
    dt_mem_plan_opts o = opts(2, 4, DT_PREC_F32, DT_OPT_ADAMW, 0, 1, 1024);
    CHECK(dt_mem_plan_make(&layout, &o, &p, err, sizeof err) == 0, "%s", err);
    /* Rank 1 holds exactly the formula, rank 0 10% more parameters;
     * 4 Psi = 474.7 MiB, 4 Psi / 4 = 118.7, 8 Psi / 4 = 237.4. */
    unsigned long long snap[2 * DT_MEM_SNAPSHOT] = {0};
    for (int r = 0; r < 2; r++) {
        unsigned long long *s = snap + r * DT_MEM_SNAPSHOT;
        s[DT_MEM_PARAMS] = r ? 497759232ull : 547535155ull;
        s[DT_MEM_GRADS] = 124439808ull;
        s[DT_MEM_OPTIM] = 248879616ull;
        s[DT_MEM_KIND_COUNT] = 2000ull * 1048576;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    dt_mem_plan_print(f, &p, "memory per rank", snap, 2);
    fclose(f);
    const char *want[] = {"Psi = 124439808 parameters", "fp32", "adamw (K = 8", "ZeRO stage 2",
                          "N = 4", "4 Psi / N", "8 Psi / N", "4 Psi + 12 Psi / N", "474.7",
                          "118.7", "237.4", "830.7", "rank 0", "522.2 x1.1000", "rank 1",
                          "474.7 x1.0000", "peak RSS 2000.0", "at most 204.3 MiB"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(strstr(text, want[i]), "table lacks '%s':\n%s", want[i], text);
    free(text);
    dt_gpt_destroy(&layout);
}

static void test_bad_input(void)
{
    dt_gpt layout;
    dt_mem_plan p;
    CHECK(dt_gpt_create_layout(&layout, &small, DT_PREC_F32, err, sizeof err) == 0, "%s", err);
    static const struct { int stage, ranks, B, T, prefetch; const char *needle; } bad[] = {
        {4, 2, 1, 8, 1, "ZeRO stage 4"},   {-1, 2, 1, 8, 1, "ZeRO stage -1"},
        {1, 0, 1, 8, 1, "0 data-parallel ranks"}, {1, -3, 1, 8, 1, "-3 data-parallel ranks"},
        {0, 1, 0, 8, 1, "micro-batch 0 x 8"}, {0, 1, 1, 9, 1, "block_size 8"},
        {3, 2, 1, 8, -1, "prefetch -1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_mem_plan_opts o = opts(bad[i].stage, bad[i].ranks, DT_PREC_F32, DT_OPT_ADAMW, 0,
                                  bad[i].B, bad[i].T);
        o.prefetch = bad[i].prefetch;
        err[0] = 0;
        CHECK(dt_mem_plan_make(&layout, &o, &p, err, sizeof err) == -1 &&
                  strstr(err, bad[i].needle), "case %zu: want '%s', got '%s'", i, bad[i].needle,
              err);
    }
    dt_gpt_destroy(&layout);
}

int main(void)
{
    test_gpt2_fp32();
    test_small_mixed_and_sgd();
    test_acts_match_allocation();
    test_config();
    test_print();
    test_bad_input();
    return finish("test_memory_plan");
}
