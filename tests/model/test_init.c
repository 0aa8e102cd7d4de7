/* The initial weights: each normal tensor's values are its own stream's
 * numbers in row-major order (model/init.c), whatever the threads; a
 * norm's weights are ones and a bias's zeros. The reference here draws the
 * stream one number after another, as the rule states it; the model draws
 * each element's numbers directly, split over threads, and a
 * tensor-parallel slice draws only what it holds. Every value must be the
 * reference's bits, in both families (the Llama layout has no positions'
 * table, so its layers' tensors start one earlier: every layer's first
 * norm must still be ones). */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "kernels/threads.h"
#include "model/gpt.h"

enum { L = 2, NH = 2, C = 32, V = 50257, BLOCK = 16 }; /* GPT-2's vocabulary */
static const uint64_t SEED = 1234;

/* splitmix64, a number at a time. */
static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double normal(uint64_t *s)
{
    double u1 = (double)(next(s) >> 11) / 9007199254740992.0 + 0.5 / 9007199254740992.0;
    double u2 = (double)(next(s) >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Tensor i of the whole model against the reference stream. */
static void check_tensor(const dt_gpt *m, int i)
{
    const dt_param_tensor *t = &m->tensors[i];
    const double std = t->init == DT_INIT_NORMAL ? 0.02 : 0.02 / sqrt(2.0 * L);
    uint64_t s = SEED * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull;
    size_t bad = 0;
    for (size_t k = 0; k < t->numel; k++) {
        const float want = t->init == DT_INIT_ZERO  ? 0.0f
                           : t->init == DT_INIT_ONE ? 1.0f
                                                    : (float)(std * normal(&s));
        bad += m->params[t->offset + k] != want;
    }
    CHECK(bad == 0, "tensor %s: %zu of %zu values differ from its rule (%d)", t->name, bad,
          t->numel, (int)t->init);
}

int main(void)
{
    char err[256] = "";
    for (int run = 0; run < 4; run++) {
        const int threads = 1 + run % 2, llama = run / 2;
        dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C, .vocab_size = V,
                             .block_size = BLOCK, .arch = llama ? DT_ARCH_LLAMA : DT_ARCH_GPT2};
        dt_kernels_set_threads(threads);
        dt_gpt m;
        if (dt_gpt_create(&m, &cfg, DT_PREC_F32, err, sizeof err)) {
            CHECK(0, "model: %s", err);
            return finish("model.init");
        }
        dt_gpt_init_weights(&m, SEED);
        static const char *const labels[4] = {"GPT-2, 1 thread: ", "GPT-2, 2 threads: ",
                                              "Llama, 1 thread: ", "Llama, 2 threads: "};
        check_set_label(labels[run]);
        int normals = 0, ones = 0;
        for (int i = 0; i < m.n_tensors; i++) {
            check_tensor(&m, i);
            normals += m.tensors[i].init == DT_INIT_NORMAL || m.tensors[i].init == DT_INIT_RESIDUAL;
            ones += m.tensors[i].init == DT_INIT_ONE;
        }
        /* GPT-2: wte, wpe and 4 matrices a layer; Llama: the tokens' table,
         * 7 matrices a layer and the head. Two norms a layer and the final. */
        CHECK(normals >= (llama ? 2 + 7 * L : 2 + 4 * L), "only %d tensors drawn from a normal",
              normals);
        CHECK(ones == 2 * L + 1, "%d norm weights, expected %d", ones, 2 * L + 1);
        dt_gpt_destroy(&m);
    }
    return finish("model.init");
}
